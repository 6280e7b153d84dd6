//! The gateway's memory allocator, jemalloc, and its figures.
//!
//! jemalloc keeps the large buffers a bulk flow cycles through (read buffers
//! up to 256 KiB, TLS and HTTP/2 buffers) for reuse, where glibc returned
//! them to the kernel and faulted fresh zeroed pages in for every one
//! (docs/performance.md, "What the defaults buy": page faults and CPU-seconds per GB).
//!
//! It runs with background threads (the `background_threads` feature of
//! `tikv-jemallocator`, i.e. `background_thread:true`): freed pages are given
//! back to the kernel after jemalloc's decay time (10 s) whether or not the
//! gateway allocates again. Without them the purge only happens inside later
//! allocations, and an idle gateway kept the memory of a large workload set
//! it no longer had (a 200,000-workload file replaced by 10 workloads: 3 MB
//! allocated, 208 MB resident a minute later; with them, 20 MB resident
//! after 15 s). The data path runs as before: its buffers are reused well
//! within the decay time. `_RJEM_MALLOC_CONF` still overrides it at run
//! time (e.g. `background_thread:false`).
//!
//! [`AllocatorMetrics`] reports what jemalloc holds, read at scrape time:
//! `allocated` (live allocations) against `resident` (its pages in memory).
//! A large gap is memory freed and not yet returned; a large `allocated` is
//! memory the gateway still uses.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tikv_jemalloc_ctl::{epoch, stats};

/// The gateway's global allocator, set by the `tidegate` binary and by the
/// bench programs that run its code in process (so what they time is what
/// the gateway runs).
pub type Allocator = tikv_jemallocator::Jemalloc;

/// The value for a `#[global_allocator]` static of type [`Allocator`].
pub const ALLOCATOR: Allocator = tikv_jemallocator::Jemalloc;

/// `tidegate_allocator_allocated_bytes` and
/// `tidegate_allocator_resident_bytes`, read from jemalloc at scrape time.
/// Returns the pages of freed memory to the kernel now rather than over
/// jemalloc's decay time (10 s); the resident bytes before and after. For
/// the moment a large, short-lived working set has just been let go
/// (istiod's first answer decoded and applied: tens of MB of messages
/// and converted resources), so the node does not count them as the
/// gateway's for the next ten seconds. Each arena's dirty decay is set to
/// zero, which purges what it holds at once, and put back. `None`:
/// jemalloc's figures are unreadable.
pub fn return_freed() -> Option<(u64, u64)> {
    use tikv_jemalloc_ctl::{arenas, Access, AsName};
    let resident = || {
        epoch::advance().ok()?;
        stats::resident::read().ok().map(|r| r as u64)
    };
    let before = resident()?;
    for i in 0..arenas::narenas::read().ok()? {
        let key = format!("arena.{i}.dirty_decay_ms\0");
        let name = key.as_str().name();
        let Ok(decay) = Access::<isize>::read(name) else {
            continue;
        };
        let _ = name.write(0isize);
        let _ = name.write(decay);
    }
    Some((before, resident()?))
}

#[derive(Debug)]
pub struct AllocatorMetrics;

impl AllocatorMetrics {
    pub fn register(registry: &mut Registry) {
        registry
            .sub_registry_with_prefix("allocator")
            .register_collector(Box::new(AllocatorMetrics));
    }
}

impl prometheus_client::collector::Collector for AllocatorMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // jemalloc's statistics are a snapshot refreshed by each epoch.
        if epoch::advance().is_err() {
            return Ok(());
        }
        let figures = [
            (
                "allocated_bytes",
                "Bytes in live allocations of the gateway's allocator (jemalloc stats.allocated)",
                stats::allocated::read(),
            ),
            (
                "resident_bytes",
                "Bytes of the allocator's pages resident in memory, its metadata included \
                 (jemalloc stats.resident); above allocated_bytes: memory freed and not yet \
                 returned to the kernel",
                stats::resident::read(),
            ),
        ];
        for (name, help, value) in figures {
            let Ok(value) = value else { continue };
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value as i64).encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figure of `name` in `text` (the metrics' exposition).
    fn figure(text: &str, name: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    }

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    /// The unit tests run on the gateway's allocator (see `lib.rs`): a
    /// 128 MiB buffer shows in `allocated`, and freeing it takes it out
    /// (within half of it: other tests allocate meanwhile).
    #[test]
    fn allocated_and_resident_follow_the_heap() {
        let mut registry = Registry::with_prefix("tidegate");
        AllocatorMetrics::register(&mut registry);
        const SIZE: u64 = 128 << 20;
        let before = figure(&scrape(&registry), "tidegate_allocator_allocated_bytes");
        let buffer = vec![1u8; SIZE as usize];
        let text = scrape(&registry);
        let held = figure(&text, "tidegate_allocator_allocated_bytes");
        assert!(held >= before + SIZE / 2, "{before} -> {held}\n{text}");
        assert!(
            figure(&text, "tidegate_allocator_resident_bytes") >= SIZE,
            "{text}"
        );
        drop(buffer);
        let after = figure(&scrape(&registry), "tidegate_allocator_allocated_bytes");
        assert!(after + SIZE / 2 <= held, "{held} -> {after}");
    }

    /// A freed buffer's pages leave the resident set as soon as
    /// [`return_freed`] is called (within half of it: other tests
    /// allocate meanwhile).
    #[test]
    fn return_freed_gives_a_freed_buffers_pages_back_at_once() {
        const SIZE: usize = 96 << 20;
        let buffer = vec![1u8; SIZE];
        std::hint::black_box(&buffer);
        drop(buffer);
        let (before, after) = return_freed().expect("jemalloc answers");
        epoch::advance().unwrap();
        let allocated = stats::allocated::read().unwrap();
        assert!(
            after < allocated as u64 + SIZE as u64 / 2,
            "resident {before} -> {after}, allocated {allocated}"
        );
    }

    /// Freed pages go back to the kernel without waiting for the gateway's
    /// next allocation.
    #[test]
    fn background_threads_are_on() {
        assert_eq!(tikv_jemalloc_ctl::background_thread::read(), Ok(true));
    }
}
