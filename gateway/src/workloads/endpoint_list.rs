//! One Service port's endpoints as the data path reads them: in workload
//! uid order, read by index and sampled in proportion to capacity, and
//! changed one endpoint at a time at the cost of one chunk, not of the
//! list.
//!
//! The list is held in chunks of at most [`CHUNK`] endpoints, each shared
//! (`Arc`) with the snapshots before: a change copies the chunk it falls
//! in and the chunk table (a pointer, a start and a running capacity
//! total a chunk), so an endpoint of a Service of 10,000 costs about what
//! one of a Service of 64 does. A lookup by index is a binary search of
//! the chunk table (none for one chunk); a weighted sample, one of the
//! running totals and a walk of at most one chunk.

use std::sync::Arc;

use super::endpoint::Endpoint;

/// Endpoints a chunk holds at most; a full chunk that gains one is split.
pub const CHUNK: usize = 64;

#[derive(Clone, Debug)]
struct Chunk {
    /// The index of its first endpoint in the list.
    start: usize,
    /// The capacities of the chunks up to this one, this one included.
    total: u64,
    /// The capacity all its endpoints share, if they do.
    uniform: Option<u32>,
    entries: Arc<[Endpoint]>,
}

impl Chunk {
    fn new(entries: Arc<[Endpoint]>) -> Chunk {
        let first = entries.first().map_or(1, |e| e.capacity);
        let uniform = entries.iter().all(|e| e.capacity == first).then_some(first);
        Chunk {
            start: 0,
            total: 0,
            uniform,
            entries,
        }
    }

    fn capacity(&self) -> u64 {
        match self.uniform {
            Some(c) => u64::from(c) * self.entries.len() as u64,
            None => self.entries.iter().map(|e| u64::from(e.capacity)).sum(),
        }
    }
}

/// A Service port's endpoints, in uid order (see the module's doc).
#[derive(Clone, Debug, Default)]
pub struct EndpointList {
    chunks: Vec<Chunk>,
    len: usize,
    /// The capacity every endpoint shares, if they do: sampled uniformly.
    uniform: Option<u32>,
}

impl EndpointList {
    /// No endpoint (a port a Service does not have), borrowed for as long
    /// as anything.
    pub const EMPTY: &'static EndpointList = &EndpointList {
        chunks: Vec::new(),
        len: 0,
        uniform: None,
    };

    /// The list of `sorted`, in uid order with each uid once (what
    /// resolving a whole Service gives).
    pub fn from_sorted(sorted: Vec<Endpoint>) -> EndpointList {
        debug_assert!(sorted
            .windows(2)
            .all(|w| w[0].workload.uid() < w[1].workload.uid()));
        let mut list = EndpointList {
            chunks: sorted.chunks(CHUNK).map(|c| Chunk::new(c.into())).collect(),
            ..Default::default()
        };
        list.renumber(0);
        list
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The endpoint at `index` (uid order).
    pub fn get(&self, index: usize) -> Option<&Endpoint> {
        if index >= self.len {
            return None;
        }
        let c = self.chunk_of(index);
        let chunk = &self.chunks[c];
        chunk.entries.get(index - chunk.start)
    }

    pub fn iter(&self) -> Iter<'_> {
        Iter {
            chunks: self.chunks.iter(),
            current: [].iter(),
        }
    }

    /// The endpoint of workload `uid`.
    pub fn find(&self, uid: &str) -> Option<&Endpoint> {
        let (c, at) = self.position(uid).ok()?;
        self.chunks[c].entries.get(at)
    }

    /// The index of a random endpoint, in proportion to its capacity
    /// (uniform when all weigh the same). The list must not be empty.
    pub fn sample(&self) -> usize {
        if self.uniform.is_some() {
            return fastrand::usize(..self.len);
        }
        let total = self.chunks.last().map_or(0, |c| c.total);
        if total == 0 {
            return fastrand::usize(..self.len);
        }
        let r = fastrand::u64(..total);
        let c = self.chunks.partition_point(|c| c.total <= r);
        let chunk = &self.chunks[c];
        let mut before = chunk.total - chunk.capacity();
        for (i, e) in chunk.entries.iter().enumerate() {
            before += u64::from(e.capacity);
            if r < before {
                return chunk.start + i;
            }
        }
        chunk.start + chunk.entries.len() - 1
    }

    /// Puts `e` in place of the endpoint of its workload, or adds it.
    pub fn put(&mut self, e: Endpoint) {
        match self.position(e.workload.uid()) {
            Ok((c, at)) => {
                let mut entries = self.chunks[c].entries.to_vec();
                entries[at] = e;
                self.chunks[c] = Chunk::new(entries.into());
                self.renumber(c);
            }
            Err((c, at)) if self.chunks.is_empty() => {
                debug_assert_eq!((c, at), (0, 0));
                self.chunks.push(Chunk::new(Arc::from([e])));
                self.renumber(0);
            }
            Err((c, at)) => {
                let mut entries = Vec::with_capacity(self.chunks[c].entries.len() + 1);
                entries.extend_from_slice(&self.chunks[c].entries);
                entries.insert(at, e);
                if entries.len() > CHUNK {
                    let right = entries.split_off(entries.len() / 2);
                    self.chunks[c] = Chunk::new(entries.into());
                    self.chunks.insert(c + 1, Chunk::new(right.into()));
                } else {
                    self.chunks[c] = Chunk::new(entries.into());
                }
                self.renumber(c);
            }
        }
    }

    /// Removes the endpoint of workload `uid`; whether there was one.
    pub fn remove(&mut self, uid: &str) -> bool {
        let Ok((c, at)) = self.position(uid) else {
            return false;
        };
        let mut entries = self.chunks[c].entries.to_vec();
        entries.remove(at);
        if entries.is_empty() {
            self.chunks.remove(c);
        } else {
            self.chunks[c] = Chunk::new(entries.into());
        }
        self.renumber(c.min(self.chunks.len()));
        true
    }

    /// Where workload `uid`'s endpoint is (chunk, offset), or where it
    /// would go.
    fn position(&self, uid: &str) -> Result<(usize, usize), (usize, usize)> {
        if self.chunks.is_empty() {
            return Err((0, 0));
        }
        // The last chunk whose first uid is not past `uid`.
        let c = self
            .chunks
            .partition_point(|c| c.entries[0].workload.uid() <= uid)
            .saturating_sub(1);
        let entries = &self.chunks[c].entries;
        match entries.binary_search_by(|e| e.workload.uid().cmp(uid)) {
            Ok(at) => Ok((c, at)),
            Err(at) => Err((c, at)),
        }
    }

    /// The chunk holding index `index`.
    fn chunk_of(&self, index: usize) -> usize {
        if self.chunks.len() == 1 {
            return 0;
        }
        self.chunks.partition_point(|c| c.start <= index) - 1
    }

    /// The starts and running totals again, from chunk `from` on (the
    /// chunks before it did not move); the list's length and uniformity.
    fn renumber(&mut self, from: usize) {
        let (mut start, mut total) = match from.checked_sub(1).map(|p| &self.chunks[p]) {
            Some(p) => (p.start + p.entries.len(), p.total),
            None => (0, 0),
        };
        for c in &mut self.chunks[from..] {
            c.start = start;
            total += c.capacity();
            c.total = total;
            start += c.entries.len();
        }
        self.len = start;
        let first = self.chunks.first().and_then(|c| c.uniform);
        self.uniform = first.filter(|f| self.chunks.iter().all(|c| c.uniform == Some(*f)));
    }
}

impl std::ops::Index<usize> for EndpointList {
    type Output = Endpoint;

    fn index(&self, index: usize) -> &Endpoint {
        match self.get(index) {
            Some(e) => e,
            None => panic!("endpoint {index} of a list of {}", self.len),
        }
    }
}

/// The endpoints of an [`EndpointList`], in uid order.
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    chunks: std::slice::Iter<'a, Chunk>,
    current: std::slice::Iter<'a, Endpoint>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Endpoint;

    fn next(&mut self) -> Option<&'a Endpoint> {
        loop {
            if let Some(e) = self.current.next() {
                return Some(e);
            }
            self.current = self.chunks.next()?.entries.iter();
        }
    }
}

impl<'a> IntoIterator for &'a EndpointList {
    type Item = &'a Endpoint;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

#[cfg(test)]
#[path = "endpoint_list_tests.rs"]
mod tests;
