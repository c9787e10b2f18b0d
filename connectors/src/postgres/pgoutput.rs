//! A decoder for the `pgoutput` logical replication protocol (version 1).
//!
//! Every message of the stream arrives as the payload of an `XLogData` frame;
//! [`decode`] reads one payload into a [`Message`] that borrows from it. The
//! decoder is written for hostile input: it never panics, never reads past the
//! buffer, and never allocates more than the input could describe (a column
//! count is checked against the bytes left before a vector is sized by it).
//! `fuzz/fuzz_targets/pgoutput.rs` and a property test hold it to that.
//!
//! Wire format (PostgreSQL documentation, "Logical Replication Message
//! Formats"): integers are big-endian, strings are NUL-terminated.

use std::fmt;

/// A decoded pgoutput message, borrowing column data from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// `B`: a transaction starts.
    Begin {
        /// LSN of the commit record.
        final_lsn: u64,
        /// Commit time, microseconds since 2000-01-01.
        commit_time: i64,
        /// Transaction id.
        xid: u32,
    },
    /// `C`: the transaction committed.
    Commit {
        /// Flags (unused, 0).
        flags: u8,
        /// LSN of the commit record.
        commit_lsn: u64,
        /// End of the commit record: the position to confirm.
        end_lsn: u64,
        /// Commit time, microseconds since 2000-01-01.
        commit_time: i64,
    },
    /// `O`: the transaction came from another origin.
    Origin {
        /// The commit LSN on the origin server.
        commit_lsn: u64,
        /// The origin's name.
        name: &'a str,
    },
    /// `R`: a table's description, sent before its first change and after
    /// every schema change.
    Relation(Relation<'a>),
    /// `Y`: a non-built-in type used by a relation.
    Type {
        /// The type's OID.
        oid: u32,
        /// Its schema.
        namespace: &'a str,
        /// Its name.
        name: &'a str,
    },
    /// `I`: a row was inserted.
    Insert {
        /// The relation.
        rel_id: u32,
        /// The new row.
        new: TupleData<'a>,
    },
    /// `U`: a row was updated.
    Update {
        /// The relation.
        rel_id: u32,
        /// The old row: its key (`K`, when the key changed) or all of it
        /// (`O`, with `REPLICA IDENTITY FULL`).
        old: Option<OldTuple<'a>>,
        /// The new row.
        new: TupleData<'a>,
    },
    /// `D`: a row was deleted.
    Delete {
        /// The relation.
        rel_id: u32,
        /// The old row's key or all of it.
        old: OldTuple<'a>,
    },
    /// `T`: tables were truncated.
    Truncate {
        /// `CASCADE` (1) and `RESTART IDENTITY` (2) bits.
        options: u8,
        /// The relations.
        rel_ids: Vec<u32>,
    },
    /// `M`: a logical decoding message (`pg_logical_emit_message`).
    LogicalMessage {
        /// Whether it was emitted inside a transaction.
        transactional: bool,
        /// Its LSN.
        lsn: u64,
        /// The prefix it was emitted with.
        prefix: &'a str,
        /// Its content.
        content: &'a [u8],
    },
}

/// The old row of an update or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple<'a> {
    /// `K`: only the replica identity key columns (others are null).
    Key(TupleData<'a>),
    /// `O`: the whole old row (`REPLICA IDENTITY FULL`).
    Full(TupleData<'a>),
}

impl<'a> OldTuple<'a> {
    /// The tuple, whichever kind it is.
    pub fn tuple(&self) -> &TupleData<'a> {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }
}

/// A table's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation<'a> {
    /// The relation's OID.
    pub rel_id: u32,
    /// Its schema.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// `d` default, `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    /// Its columns in attribute order.
    pub columns: Vec<RelationColumn<'a>>,
}

/// One column of a relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn<'a> {
    /// Whether the column is part of the replica identity key.
    pub key: bool,
    /// The column's name.
    pub name: &'a str,
    /// Its type's OID.
    pub type_oid: u32,
    /// Its type modifier.
    pub type_modifier: i32,
}

/// The values of one row, in the relation's column order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TupleData<'a> {
    /// One entry per column.
    pub columns: Vec<ColumnValue<'a>>,
}

/// One column's value in a tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnValue<'a> {
    /// `n`: SQL NULL.
    Null,
    /// `u`: an unchanged TOASTed value that was not sent.
    UnchangedToast,
    /// `t`: the value in the type's text output format.
    Text(&'a [u8]),
    /// `b`: the value in the type's binary format.
    Binary(&'a [u8]),
}

/// Why a payload is not a valid pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The message tag, when one was read.
    pub tag: Option<u8>,
    /// Where in the payload the problem was found.
    pub offset: usize,
    /// What was wrong.
    pub reason: &'static str,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tag {
            Some(tag) if tag.is_ascii_graphic() => write!(
                f,
                "malformed pgoutput message '{}' at byte {}: {}",
                tag as char, self.offset, self.reason
            ),
            Some(tag) => write!(
                f,
                "malformed pgoutput message 0x{tag:02x} at byte {}: {}",
                self.offset, self.reason
            ),
            None => write!(f, "malformed pgoutput message: {}", self.reason),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A cursor over a payload.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    tag: Option<u8>,
}

impl<'a> Reader<'a> {
    fn err(&self, reason: &'static str) -> DecodeError {
        DecodeError {
            tag: self.tag,
            offset: self.pos,
            reason,
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(self.err("truncated"));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }

    fn i16(&mut self) -> Result<i16, DecodeError> {
        let b = self.bytes(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        let b = self.bytes(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(self.i32()? as u32)
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(self.i64()? as u64)
    }

    fn cstr(&mut self) -> Result<&'a str, DecodeError> {
        let rest = &self.buf[self.pos..];
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.err("unterminated string"))?;
        let s = std::str::from_utf8(&rest[..len]).map_err(|_| self.err("string is not UTF-8"))?;
        self.pos += len + 1;
        Ok(s)
    }

    fn finish<T>(&self, value: T) -> Result<T, DecodeError> {
        if self.remaining() == 0 {
            Ok(value)
        } else {
            Err(self.err("trailing bytes"))
        }
    }

    fn tuple(&mut self) -> Result<TupleData<'a>, DecodeError> {
        let n = self.i16()?;
        let n = usize::try_from(n).map_err(|_| self.err("negative column count"))?;
        // Every column takes at least its one-byte kind: a count larger
        // than the bytes left is a lie, and must not size an allocation.
        if n > self.remaining() {
            return Err(self.err("column count exceeds the message"));
        }
        let mut columns = Vec::with_capacity(n);
        for _ in 0..n {
            let value = match self.u8()? {
                b'n' => ColumnValue::Null,
                b'u' => ColumnValue::UnchangedToast,
                kind @ (b't' | b'b') => {
                    let len = self.i32()?;
                    let len =
                        usize::try_from(len).map_err(|_| self.err("negative value length"))?;
                    let data = self.bytes(len)?;
                    if kind == b't' {
                        ColumnValue::Text(data)
                    } else {
                        ColumnValue::Binary(data)
                    }
                }
                _ => return Err(self.err("unknown column kind")),
            };
            columns.push(value);
        }
        Ok(TupleData { columns })
    }

    fn old_tuple(&mut self, kind: u8) -> Result<OldTuple<'a>, DecodeError> {
        match kind {
            b'K' => Ok(OldTuple::Key(self.tuple()?)),
            b'O' => Ok(OldTuple::Full(self.tuple()?)),
            _ => Err(self.err("expected K or O tuple")),
        }
    }
}

/// Smallest encoding of one relation column: flags, empty name's NUL,
/// type OID and modifier.
const MIN_RELATION_COLUMN: usize = 1 + 1 + 4 + 4;

/// Decodes one pgoutput message.
pub fn decode(buf: &[u8]) -> Result<Message<'_>, DecodeError> {
    let mut r = Reader {
        buf,
        pos: 0,
        tag: None,
    };
    let tag = r.u8()?;
    r.tag = Some(tag);
    let msg = match tag {
        b'B' => Message::Begin {
            final_lsn: r.u64()?,
            commit_time: r.i64()?,
            xid: r.u32()?,
        },
        b'C' => Message::Commit {
            flags: r.u8()?,
            commit_lsn: r.u64()?,
            end_lsn: r.u64()?,
            commit_time: r.i64()?,
        },
        b'O' => Message::Origin {
            commit_lsn: r.u64()?,
            name: r.cstr()?,
        },
        b'R' => {
            let rel_id = r.u32()?;
            let namespace = r.cstr()?;
            let name = r.cstr()?;
            let replica_identity = r.u8()?;
            let n = usize::try_from(r.i16()?).map_err(|_| r.err("negative column count"))?;
            if n.saturating_mul(MIN_RELATION_COLUMN) > r.remaining() {
                return Err(r.err("column count exceeds the message"));
            }
            let mut columns = Vec::with_capacity(n);
            for _ in 0..n {
                let flags = r.u8()?;
                columns.push(RelationColumn {
                    key: flags & 1 == 1,
                    name: r.cstr()?,
                    type_oid: r.u32()?,
                    type_modifier: r.i32()?,
                });
            }
            Message::Relation(Relation {
                rel_id,
                namespace,
                name,
                replica_identity,
                columns,
            })
        }
        b'Y' => Message::Type {
            oid: r.u32()?,
            namespace: r.cstr()?,
            name: r.cstr()?,
        },
        b'I' => {
            let rel_id = r.u32()?;
            if r.u8()? != b'N' {
                return Err(r.err("expected N tuple"));
            }
            Message::Insert {
                rel_id,
                new: r.tuple()?,
            }
        }
        b'U' => {
            let rel_id = r.u32()?;
            let mut kind = r.u8()?;
            let old = if kind == b'K' || kind == b'O' {
                let old = r.old_tuple(kind)?;
                kind = r.u8()?;
                Some(old)
            } else {
                None
            };
            if kind != b'N' {
                return Err(r.err("expected N tuple"));
            }
            Message::Update {
                rel_id,
                old,
                new: r.tuple()?,
            }
        }
        b'D' => {
            let rel_id = r.u32()?;
            let kind = r.u8()?;
            Message::Delete {
                rel_id,
                old: r.old_tuple(kind)?,
            }
        }
        b'T' => {
            let n = usize::try_from(r.i32()?).map_err(|_| r.err("negative relation count"))?;
            let options = r.u8()?;
            if n.saturating_mul(4) > r.remaining() {
                return Err(r.err("relation count exceeds the message"));
            }
            let mut rel_ids = Vec::with_capacity(n);
            for _ in 0..n {
                rel_ids.push(r.u32()?);
            }
            Message::Truncate { options, rel_ids }
        }
        b'M' => {
            let flags = r.u8()?;
            let lsn = r.u64()?;
            let prefix = r.cstr()?;
            let len = usize::try_from(r.i32()?).map_err(|_| r.err("negative content length"))?;
            Message::LogicalMessage {
                transactional: flags & 1 == 1,
                lsn,
                prefix,
                content: r.bytes(len)?,
            }
        }
        _ => return Err(r.err("unknown message tag")),
    };
    r.finish(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tuple(values: &[Option<&str>]) -> Vec<u8> {
        let mut b = (values.len() as i16).to_be_bytes().to_vec();
        for v in values {
            match v {
                None => b.push(b'n'),
                Some("\u{0}toast") => b.push(b'u'),
                Some(s) => {
                    b.push(b't');
                    b.extend_from_slice(&(s.len() as i32).to_be_bytes());
                    b.extend_from_slice(s.as_bytes());
                }
            }
        }
        b
    }

    #[test]
    fn decodes_relation_and_changes() {
        let mut rel = vec![b'R'];
        rel.extend_from_slice(&16384u32.to_be_bytes());
        rel.extend_from_slice(b"public\0invoices\0");
        rel.push(b'd');
        rel.extend_from_slice(&2i16.to_be_bytes());
        rel.push(1);
        rel.extend_from_slice(b"id\0");
        rel.extend_from_slice(&20u32.to_be_bytes());
        rel.extend_from_slice(&(-1i32).to_be_bytes());
        rel.push(0);
        rel.extend_from_slice(b"status\0");
        rel.extend_from_slice(&25u32.to_be_bytes());
        rel.extend_from_slice(&(-1i32).to_be_bytes());
        let Message::Relation(r) = decode(&rel).unwrap() else {
            panic!("not a relation")
        };
        assert_eq!(
            (r.namespace, r.name, r.replica_identity),
            ("public", "invoices", b'd')
        );
        assert_eq!(r.columns.len(), 2);
        assert!(r.columns[0].key && !r.columns[1].key);
        assert_eq!(r.columns[1].type_oid, 25);

        let mut upd = vec![b'U'];
        upd.extend_from_slice(&16384u32.to_be_bytes());
        upd.push(b'O');
        upd.extend(tuple(&[Some("1"), Some("draft")]));
        upd.push(b'N');
        upd.extend(tuple(&[Some("1"), Some("\u{0}toast")]));
        let Message::Update {
            old: Some(OldTuple::Full(old)),
            new,
            ..
        } = decode(&upd).unwrap()
        else {
            panic!("not an update with a full old tuple")
        };
        assert_eq!(old.columns[1], ColumnValue::Text(b"draft"));
        assert_eq!(new.columns[1], ColumnValue::UnchangedToast);

        let mut del = vec![b'D'];
        del.extend_from_slice(&16384u32.to_be_bytes());
        del.push(b'K');
        del.extend(tuple(&[Some("1"), None]));
        assert!(matches!(
            decode(&del).unwrap(),
            Message::Delete {
                old: OldTuple::Key(_),
                ..
            }
        ));
    }

    #[test]
    fn decodes_transaction_boundaries_truncate_and_messages() {
        let mut begin = vec![b'B'];
        begin.extend_from_slice(&0x16B3748u64.to_be_bytes());
        begin.extend_from_slice(&5i64.to_be_bytes());
        begin.extend_from_slice(&77u32.to_be_bytes());
        assert_eq!(
            decode(&begin).unwrap(),
            Message::Begin {
                final_lsn: 0x16B3748,
                commit_time: 5,
                xid: 77
            }
        );

        let mut t = vec![b'T'];
        t.extend_from_slice(&2i32.to_be_bytes());
        t.push(1);
        t.extend_from_slice(&1u32.to_be_bytes());
        t.extend_from_slice(&2u32.to_be_bytes());
        assert_eq!(
            decode(&t).unwrap(),
            Message::Truncate {
                options: 1,
                rel_ids: vec![1, 2]
            }
        );

        let mut m = vec![b'M', 1];
        m.extend_from_slice(&9u64.to_be_bytes());
        m.extend_from_slice(b"app\0");
        m.extend_from_slice(&2i32.to_be_bytes());
        m.extend_from_slice(b"hi");
        assert_eq!(
            decode(&m).unwrap(),
            Message::LogicalMessage {
                transactional: true,
                lsn: 9,
                prefix: "app",
                content: b"hi"
            }
        );
    }

    #[test]
    fn rejects_lies_about_lengths() {
        // 32767 columns announced in a 10-byte message: refused before any
        // allocation is sized by the count.
        let mut ins = vec![b'I', 0, 0, 0, 1, b'N'];
        ins.extend_from_slice(&i16::MAX.to_be_bytes());
        ins.push(b'n');
        let err = decode(&ins).unwrap_err();
        assert_eq!(err.reason, "column count exceeds the message");

        let mut t = vec![b'T'];
        t.extend_from_slice(&i32::MAX.to_be_bytes());
        t.push(0);
        assert!(decode(&t).is_err());

        let mut ins = vec![b'I', 0, 0, 0, 1, b'N', 0, 1, b't'];
        ins.extend_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(decode(&ins).unwrap_err().reason, "truncated");
        assert!(decode(&[]).is_err());
        assert!(decode(b"Z").is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }

        /// Arbitrary bytes after a valid tag exercise each message's parser.
        #[test]
        fn never_panics_after_a_valid_tag(
            tag in proptest::sample::select(b"BCORYIUDTM".to_vec()),
            rest in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut bytes = vec![tag];
            bytes.extend(rest);
            let _ = decode(&bytes);
        }
    }
}
