//! The wasmtime side: one engine for every plugin, an epoch ticker that
//! bounds calls, per-store memory caps, and the host functions a policy may
//! import (log, now-ms, metric) — nothing else, no WASI.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config as WasmConfig, Engine, ResourceLimiter};

use super::bindings::{types, v0_1, v0_2, v0_3};
use super::metrics::PolicyMetrics;
use super::ticker::{Busy, Ticker, EPOCH_TICK};

/// Limits applied to every plugin call.
#[derive(Clone, Debug)]
pub struct RuntimeLimits {
    /// A `decide` call is interrupted after this long.
    pub call_deadline: Duration,
    /// `init` (run on every fresh instance) gets this long.
    pub init_deadline: Duration,
    /// Linear memory cap per instance.
    pub memory_bytes: usize,
    /// Log lines a single call may write through `host.log`.
    pub logs_per_call: u32,
}

/// Log lines one call may write (not configurable).
const LOGS_PER_CALL: u32 = 8;

impl crate::config::PoliciesConfig {
    /// The limits these settings give; the gateway and `tidegate policy
    /// test/check` both take their limits from here.
    pub fn runtime_limits(&self) -> RuntimeLimits {
        RuntimeLimits {
            call_deadline: self.call_deadline,
            init_deadline: self.init_deadline,
            memory_bytes: self.memory_limit as usize,
            logs_per_call: LOGS_PER_CALL,
        }
    }
}

/// The limits of the default `policies:` section (defined there, once).
impl Default for RuntimeLimits {
    fn default() -> Self {
        crate::config::PoliciesConfig::default().runtime_limits()
    }
}

/// Where `host.now-ms` reads its time: the wall clock, or a trace's value.
#[derive(Clone, Copy, Debug, Default)]
pub enum Clock {
    #[default]
    Wall,
    Fixed(u64),
}

impl Clock {
    pub fn now_ms(self) -> u64 {
        match self {
            Clock::Fixed(t) => t,
            Clock::Wall => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }
}

/// The data of one plugin store.
pub struct HostState {
    pub(super) policy: String,
    pub(super) clock: Clock,
    pub(super) memory_cap: usize,
    pub(super) memory_exceeded: bool,
    pub(super) logs_left: u32,
    pub(super) metrics: PolicyMetrics,
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            self.memory_exceeded = true;
            // An error (not `Ok(false)`) traps at once: a guest allocator
            // would otherwise spin or abort in ways that look like other bugs.
            wasmtime::bail!("memory cap of {} bytes exceeded", self.memory_cap);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl types::Host for HostState {}

impl HostState {
    fn log_line(&mut self, level: types::LogLevel, message: String) {
        if self.logs_left == 0 {
            return;
        }
        self.logs_left -= 1;
        let message: String = message.chars().take(512).collect();
        let policy = self.policy.as_str();
        match level {
            types::LogLevel::Trace => tracing::trace!(policy, "{message}"),
            types::LogLevel::Debug => tracing::debug!(policy, "{message}"),
            types::LogLevel::Info => tracing::info!(policy, "{message}"),
            types::LogLevel::Warn => tracing::warn!(policy, "{message}"),
            types::LogLevel::Error => tracing::error!(policy, "{message}"),
        }
    }
}

/// The host functions, the same for every contract version.
macro_rules! host_impl {
    ($host:path) => {
        impl $host for HostState {
            fn log(&mut self, level: types::LogLevel, message: String) {
                self.log_line(level, message)
            }

            fn now_ms(&mut self) -> u64 {
                self.clock.now_ms()
            }

            fn metric(&mut self, name: String, delta: u64) {
                self.metrics.plugin_counter(&self.policy, &name, delta);
            }
        }
    };
}
host_impl!(v0_1::tidegate::policy::host::Host);
host_impl!(v0_2::tidegate::policy::host::Host);
host_impl!(v0_3::tidegate::policy::host::Host);

/// The shared engine and linker.
pub struct PolicyRuntime {
    pub(super) engine: Engine,
    pub(super) linker: Linker<HostState>,
    pub(super) limits: RuntimeLimits,
    pub(super) metrics: PolicyMetrics,
    ticker: Ticker,
}

impl PolicyRuntime {
    pub fn new(limits: RuntimeLimits, metrics: PolicyMetrics) -> wasmtime::Result<Arc<Self>> {
        let mut cfg = WasmConfig::new();
        cfg.wasm_component_model(true)
            // Concurrent (async) component execution is not used; with it on,
            // every call pays 2-3x for bookkeeping (measured; ARCHITECTURE.md, "Policy host").
            .concurrency_support(false)
            // A trap is logged with its message; capturing the wasm backtrace
            // made a failing call cost more than re-instantiating (measured).
            .wasm_backtrace_max_frames(None)
            .epoch_interruption(true)
            .cranelift_opt_level(wasmtime::OptLevel::Speed);
        let engine = Engine::new(&cfg)?;
        let mut linker = Linker::new(&engine);
        v0_1::DrainPolicy::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        // Later versions share 0.1.0's types (bindings.rs): only their host
        // functions are new, and their types interface is an instance
        // without functions.
        v0_2::tidegate::policy::host::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        linker.instance("tidegate:policy/types@0.2.0")?;
        v0_3::tidegate::policy::host::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        linker.instance("tidegate:policy/types@0.3.0")?;
        let ticker = Ticker::spawn(engine.clone())?;
        Ok(Arc::new(PolicyRuntime {
            engine,
            linker,
            limits,
            metrics,
            ticker,
        }))
    }

    /// The wasmtime engine (benchmarks time compilation with it).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn limits(&self) -> &RuntimeLimits {
        &self.limits
    }

    /// Epoch ticks for a deadline (at least one, plus one for the tick in progress).
    pub(super) fn ticks(d: Duration) -> u64 {
        (d.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64 + 1
    }

    /// Marks a plugin call (instantiation, `init`, `decide`) in progress:
    /// epoch deadlines only advance while one is.
    pub(super) fn busy(&self) -> Busy<'_> {
        self.ticker.busy()
    }
}
