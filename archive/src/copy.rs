//! Postgres's binary `COPY` format, read tuple by tuple: how the export
//! reads a day (one stream of large messages, no per-row result objects).
//!
//! Layout: an 11-byte signature, 32-bit flags and a header extension; then
//! per tuple a 16-bit field count and per field a 32-bit length (-1 for
//! NULL) and its bytes in the type's binary form; then a count of -1.

use bytes::{Buf, Bytes, BytesMut};

const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

/// What [`CopyReader::next_tuple`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// A tuple: read its fields with [`CopyReader::field`].
    Tuple,
    /// The buffer ends inside a tuple: feed more bytes.
    NeedMore,
    /// The trailer: the copy is complete.
    End,
}

/// Reads tuples out of the bytes of a binary `COPY … TO STDOUT`.
#[derive(Debug, Default)]
pub struct CopyReader {
    buf: BytesMut,
    header_done: bool,
    tuple: Bytes,
    fields: Vec<Option<(usize, usize)>>,
}

impl CopyReader {
    /// A reader before the header.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes as they arrive.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Moves to the next complete tuple, if the buffer holds one.
    pub fn next_tuple(&mut self) -> Result<Next, String> {
        if !self.header_done {
            if self.buf.len() < SIGNATURE.len() + 8 {
                return Ok(Next::NeedMore);
            }
            if &self.buf[..SIGNATURE.len()] != SIGNATURE {
                return Err("the copy does not start with the binary signature".into());
            }
            let ext = u32::from_be_bytes(self.buf[15..19].try_into().expect("4 bytes")) as usize;
            if self.buf.len() < 19 + ext {
                return Ok(Next::NeedMore);
            }
            self.buf.advance(19 + ext);
            self.header_done = true;
        }
        if self.buf.len() < 2 {
            return Ok(Next::NeedMore);
        }
        let count = i16::from_be_bytes([self.buf[0], self.buf[1]]);
        if count == -1 {
            return Ok(Next::End);
        }
        if count < 0 {
            return Err(format!("a tuple declares {count} fields"));
        }
        self.fields.clear();
        let mut at = 2usize;
        for _ in 0..count {
            if self.buf.len() < at + 4 {
                return Ok(Next::NeedMore);
            }
            let len = i32::from_be_bytes(self.buf[at..at + 4].try_into().expect("4 bytes"));
            at += 4;
            if len < 0 {
                self.fields.push(None);
                continue;
            }
            let len = len as usize;
            if self.buf.len() < at + len {
                return Ok(Next::NeedMore);
            }
            self.fields.push(Some((at, at + len)));
            at += len;
        }
        self.tuple = self.buf.split_to(at).freeze();
        Ok(Next::Tuple)
    }

    /// Field `i` of the current tuple (`None` for NULL).
    pub fn field(&self, i: usize) -> Option<&[u8]> {
        self.fields
            .get(i)
            .copied()
            .flatten()
            .map(|(a, b)| &self.tuple[a..b])
    }

    /// The current tuple's size in the copy stream (its field lengths and
    /// values): what the part it joins grows by, give or take the offsets
    /// Arrow keeps.
    pub fn tuple_bytes(&self) -> usize {
        self.tuple.len()
    }

    /// Fields in the current tuple.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether the current tuple has no fields.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy_of(rows: &[Vec<Option<&[u8]>>]) -> Vec<u8> {
        let mut v = SIGNATURE.to_vec();
        v.extend_from_slice(&0u32.to_be_bytes());
        v.extend_from_slice(&0u32.to_be_bytes());
        for r in rows {
            v.extend_from_slice(&(r.len() as i16).to_be_bytes());
            for f in r {
                match f {
                    None => v.extend_from_slice(&(-1i32).to_be_bytes()),
                    Some(b) => {
                        v.extend_from_slice(&(b.len() as i32).to_be_bytes());
                        v.extend_from_slice(b);
                    }
                }
            }
        }
        v.extend_from_slice(&(-1i16).to_be_bytes());
        v
    }

    #[test]
    fn tuples_come_out_whole_however_the_bytes_are_split() {
        let rows = vec![
            vec![Some(&b"abc"[..]), None, Some(&b""[..])],
            vec![Some(&b"x"[..]), Some(&[1u8, 2, 3, 4][..]), None],
        ];
        let bytes = copy_of(&rows);
        for step in [1, 2, 3, 7, bytes.len()] {
            let mut r = CopyReader::new();
            let mut got = Vec::new();
            let mut chunks = bytes.chunks(step);
            loop {
                match r.next_tuple().unwrap() {
                    Next::Tuple => got.push(
                        (0..r.len())
                            .map(|i| r.field(i).map(<[u8]>::to_vec))
                            .collect::<Vec<_>>(),
                    ),
                    Next::NeedMore => r.feed(chunks.next().expect("more bytes")),
                    Next::End => break,
                }
            }
            let want: Vec<Vec<Option<Vec<u8>>>> = rows
                .iter()
                .map(|r| r.iter().map(|f| f.map(<[u8]>::to_vec)).collect())
                .collect();
            assert_eq!(got, want, "split every {step} bytes");
        }
    }

    #[test]
    fn a_bad_signature_is_an_error() {
        let mut r = CopyReader::new();
        r.feed(b"PGCOPY\nXXXXXXXXXXXXXXXXXXXX");
        assert!(r.next_tuple().is_err());
    }
}
