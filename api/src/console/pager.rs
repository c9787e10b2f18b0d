//! Paging of the console's lists: *Next page* and *Previous page* links
//! over the API's cursors, and over whole lists the API returns at once.
//!
//! The API's cursors only go forward, and the pages have no script to
//! remember where the reader came from, so the way back travels in the
//! link: each page's URL carries the cursors of the pages before it
//! (`back`, the first page as an empty one), at most [`MAX_BACK`] of them;
//! further back, *First page* still leads to the start. Filters and the
//! page size (`limit`) ride along in every link.

use maud::{Markup, html};

/// Earlier pages a link remembers.
pub(crate) const MAX_BACK: usize = 40;

/// The query of a list page: its filters, page size and place.
pub(crate) struct Pager {
    path: String,
    /// Filters, as given (empty ones left out).
    keep: Vec<(String, String)>,
    /// The page size asked for, within the list's bounds.
    pub(crate) limit: usize,
    /// This page's cursor (none on the first page).
    pub(crate) cursor: Option<String>,
    back: Vec<String>,
    /// This page's number, for lists paged here (1 for the first).
    pub(crate) page: usize,
}

impl Pager {
    /// The paging of `path` from its query (`filters` are passed on in
    /// links), with `default` rows a page and `max` at most.
    pub(crate) fn new(
        path: &str,
        query: Option<&str>,
        filters: &[&str],
        default: usize,
        max: usize,
    ) -> Pager {
        let given: Vec<(String, String)> =
            serde_urlencoded::from_str(query.unwrap_or_default()).unwrap_or_default();
        let one = |name: &str| {
            given
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .filter(|v| !v.is_empty())
        };
        let limit = one("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .map_or(default, |l| l.clamp(1, max));
        let mut keep: Vec<(String, String)> = filters
            .iter()
            .filter_map(|f| one(f).map(|v| ((*f).to_owned(), v)))
            .collect();
        if limit != default {
            keep.push(("limit".into(), limit.to_string()));
        }
        let mut back: Vec<String> = given
            .iter()
            .filter(|(n, _)| n == "back")
            .map(|(_, v)| v.clone())
            .collect();
        if back.len() > MAX_BACK {
            back.drain(..back.len() - MAX_BACK);
        }
        Pager {
            path: path.to_owned(),
            keep,
            limit,
            cursor: one("cursor"),
            back,
            page: one("page")
                .and_then(|p| p.parse::<usize>().ok())
                .unwrap_or(1)
                .max(1),
        }
    }

    /// A filter's value ("" when not given).
    pub(crate) fn filter(&self, name: &str) -> String {
        self.keep
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    fn link(&self, extra: Vec<(&str, String)>) -> String {
        let mut q: Vec<(&str, String)> = self
            .keep
            .iter()
            .map(|(n, v)| (n.as_str(), v.clone()))
            .collect();
        q.extend(extra);
        let q = serde_urlencoded::to_string(&q).unwrap_or_default();
        if q.is_empty() {
            self.path.clone()
        } else {
            format!("{}?{q}", self.path)
        }
    }

    /// The links of a page of an API listing whose answer gave `next`.
    pub(crate) fn links(&self, next: Option<&str>) -> Markup {
        let next = next.map(|c| {
            let mut back = self.back.clone();
            back.push(self.cursor.clone().unwrap_or_default());
            if back.len() > MAX_BACK {
                back.remove(0);
            }
            let mut extra = vec![("cursor", c.to_owned())];
            extra.extend(back.into_iter().map(|b| ("back", b)));
            self.link(extra)
        });
        let previous = self.cursor.as_ref().map(|_| {
            let mut back = self.back.clone();
            let to = back.pop().unwrap_or_default();
            let mut extra = Vec::new();
            if !to.is_empty() {
                extra.push(("cursor", to));
            }
            extra.extend(back.into_iter().map(|b| ("back", b)));
            self.link(extra)
        });
        let first = self
            .cursor
            .as_ref()
            .filter(|_| self.back.len() > 1 || self.back.first().is_some_and(|b| !b.is_empty()))
            .map(|_| self.link(Vec::new()));
        nav(previous, first, next)
    }

    /// This page's rows of a whole list, and its links.
    pub(crate) fn slice<'a, T>(&self, all: &'a [T]) -> (&'a [T], Markup) {
        let pages = all.len().div_ceil(self.limit).max(1);
        let page = self.page.min(pages);
        let from = (page - 1) * self.limit;
        let rows = &all[from.min(all.len())..(from + self.limit).min(all.len())];
        let at = |p: usize| {
            if p == 1 {
                self.link(Vec::new())
            } else {
                self.link(vec![("page", p.to_string())])
            }
        };
        let previous = (page > 1).then(|| at(page - 1));
        let first = (page > 2).then(|| at(1));
        let next = (page < pages).then(|| at(page + 1));
        (rows, nav(previous, first, next))
    }
}

fn nav(previous: Option<String>, first: Option<String>, next: Option<String>) -> Markup {
    html! {
        @if previous.is_some() || next.is_some() {
            nav class="pager" aria-label="Pages" {
                @if let Some(first) = first { a href=(first) { "First page" } }
                @if let Some(previous) = previous { a href=(previous) rel="prev" { "Previous page" } }
                @if let Some(next) = next { a href=(next) rel="next" { "Next page" } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hrefs(m: &Markup) -> Vec<String> {
        m.0.split("href=\"")
            .skip(1)
            .map(|r| r.split('"').next().unwrap().replace("&amp;", "&"))
            .collect()
    }

    #[test]
    fn next_then_previous_come_back_to_the_same_page() {
        let first = Pager::new("/console/x", Some("status=failed"), &["status"], 50, 250);
        let next = hrefs(&first.links(Some("c1")));
        assert_eq!(next, ["/console/x?status=failed&cursor=c1&back="]);
        let second = Pager::new(
            "/console/x",
            next[0].split_once('?').map(|q| q.1),
            &["status"],
            50,
            250,
        );
        assert_eq!(second.cursor.as_deref(), Some("c1"));
        let links = hrefs(&second.links(Some("c2")));
        assert_eq!(
            links,
            [
                "/console/x?status=failed",
                "/console/x?status=failed&cursor=c2&back=&back=c1"
            ]
        );
        let third = Pager::new(
            "/console/x",
            links[1].split_once('?').map(|q| q.1),
            &["status"],
            50,
            250,
        );
        let links = hrefs(&third.links(None));
        assert_eq!(
            links,
            [
                "/console/x?status=failed",
                "/console/x?status=failed&cursor=c1&back="
            ]
        );
    }

    #[test]
    fn a_whole_list_pages_by_number_with_the_size_asked_for() {
        let all: Vec<u32> = (1..=5).collect();
        let p = Pager::new("/console/y", Some("limit=2&page=2"), &[], 20, 100);
        let (rows, links) = p.slice(&all);
        assert_eq!(rows, [3, 4]);
        assert_eq!(
            hrefs(&links),
            ["/console/y?limit=2", "/console/y?limit=2&page=3"]
        );
        let p = Pager::new("/console/y", Some("limit=0&page=99"), &[], 2, 100);
        let (rows, links) = p.slice(&all);
        assert_eq!(rows, [5], "a page past the end is the last");
        assert_eq!(hrefs(&links).len(), 2);
    }

    #[test]
    fn the_way_back_is_bounded() {
        let query: String =
            (0..100).map(|i| format!("back=c{i}&")).collect::<String>() + "cursor=z";
        let p = Pager::new("/console/x", Some(&query), &[], 50, 250);
        assert_eq!(p.back.len(), MAX_BACK);
        let next = hrefs(&p.links(Some("n")));
        assert_eq!(next.last().unwrap().matches("back=").count(), MAX_BACK);
    }
}
