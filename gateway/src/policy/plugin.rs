//! One loaded version of a plugin: compiled once, instantiated from a cached
//! `InstancePre`, one warm instance reused across calls. A failed call
//! discards the instance (a trap poisons a component store); the next call
//! re-instantiates. Repeated failures quarantine the version.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tidegate_sdk as sdk;
use wasmtime::component::Component;
use wasmtime::Store;

use super::bindings::{DrainPolicy, DrainPolicyPre};
use super::convert;
use super::error::{one_line, CallFailure, FailureKind, LoadError};
use super::runtime::{Clock, HostState, PolicyRuntime};
use super::version::{self, Version};

/// When a version is quarantined: `failures` failed calls within `window`.
#[derive(Clone, Copy, Debug)]
pub struct QuarantineRule {
    pub failures: usize,
    pub window: Duration,
}

impl crate::config::PoliciesConfig {
    /// The quarantine rule these settings give.
    pub fn quarantine_rule(&self) -> QuarantineRule {
        QuarantineRule {
            failures: self.quarantine_failures,
            window: self.quarantine_window,
        }
    }
}

/// The rule of the default `policies:` section (defined there, once).
impl Default for QuarantineRule {
    fn default() -> Self {
        crate::config::PoliciesConfig::default().quarantine_rule()
    }
}

struct Warm {
    store: Store<HostState>,
    policy: DrainPolicy,
}

/// A compiled, validated plugin version.
pub struct PluginVersion {
    pub name: String,
    /// First 16 hex digits of the SHA-256 of the wasm bytes and the configuration.
    pub hash: String,
    pub config: String,
    pub contract: Version,
    pub loaded_at: SystemTime,
    pub size: usize,
    runtime: Arc<PolicyRuntime>,
    pre: DrainPolicyPre<HostState>,
    warm: Mutex<Option<Warm>>,
    quarantine: QuarantineRule,
    recent_failures: Mutex<VecDeque<Instant>>,
    quarantined: AtomicBool,
    calls: AtomicU64,
    failures: AtomicU64,
    instantiations: AtomicU64,
}

impl std::fmt::Debug for PluginVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginVersion")
            .field("name", &self.name)
            .field("hash", &self.hash)
            .finish()
    }
}

fn digest(bytes: &[u8], config: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(bytes);
    ctx.update(&[0]);
    ctx.update(config.as_bytes());
    ctx.finish().as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The event every candidate must decide without failing before it is swapped in.
pub fn self_test_event() -> sdk::Event {
    let now = Clock::Wall.now_ms();
    let workload = sdk::WorkloadState::new(
        sdk::WorkloadInfo::new("tidegate-self-test")
            .named("tidegate-system", "self-test")
            .with_annotation("tidegate.io/self-test", "true"),
    )
    .with_inbound(1, 1);
    sdk::Event::ShutdownStarted(sdk::ShutdownStarted {
        workload,
        grace_deadline_ms: now + 30_000,
        grace_remaining_ms: 30_000,
    })
}

impl PluginVersion {
    /// Compiles, checks the contract version and imports, instantiates with
    /// `config` and runs the self-test event; the first real event then gets
    /// a fresh instance. CPU-heavy: call off the hot path.
    pub fn load(
        runtime: &Arc<PolicyRuntime>,
        name: &str,
        bytes: &[u8],
        config: &str,
        quarantine: QuarantineRule,
    ) -> Result<Arc<Self>, LoadError> {
        let version = Self::load_unchecked(runtime, name, bytes, config, quarantine, Clock::Wall)?;
        version
            .call_raw(&self_test_event(), Clock::Wall)
            .map_err(|f| LoadError::SelfTest(f.to_string()))?;
        *version.warm.lock().unwrap() = None;
        // Counters start after validation.
        version.calls.store(0, Ordering::Relaxed);
        version.instantiations.store(0, Ordering::Relaxed);
        Ok(version)
    }

    /// Compiles, checks and instantiates (running `init` with `clock`)
    /// without the self-test: `tidegate policy test` uses it so a trace's
    /// first event meets a fresh instance.
    pub fn load_unchecked(
        runtime: &Arc<PolicyRuntime>,
        name: &str,
        bytes: &[u8],
        config: &str,
        quarantine: QuarantineRule,
        clock: Clock,
    ) -> Result<Arc<Self>, LoadError> {
        let component = Component::new(&runtime.engine, bytes)
            .map_err(|e| LoadError::NotAComponent(one_line(format!("{e:#}"))))?;
        let contract = version::check(&runtime.engine, &component)?;
        let pre = runtime
            .linker
            .instantiate_pre(&component)
            .and_then(DrainPolicyPre::new)
            .map_err(|e| LoadError::Instantiate(one_line(format!("{e:#}"))))?;
        let version = Arc::new(PluginVersion {
            name: name.to_owned(),
            hash: digest(bytes, config),
            config: config.to_owned(),
            contract,
            loaded_at: SystemTime::now(),
            size: bytes.len(),
            runtime: runtime.clone(),
            pre,
            warm: Mutex::new(None),
            quarantine,
            recent_failures: Mutex::new(VecDeque::new()),
            quarantined: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            instantiations: AtomicU64::new(0),
        });
        let warm = version.instantiate(clock).map_err(|f| match f.kind {
            FailureKind::Init => LoadError::Init(one_line(f.detail)),
            _ => LoadError::Instantiate(f.to_string()),
        })?;
        *version.warm.lock().unwrap() = Some(warm);
        Ok(version)
    }

    fn new_store(&self, clock: Clock) -> Store<HostState> {
        let mut store = Store::new(
            &self.runtime.engine,
            HostState {
                policy: self.name.clone(),
                clock,
                memory_cap: self.runtime.limits.memory_bytes,
                memory_exceeded: false,
                logs_left: self.runtime.limits.logs_per_call,
                metrics: self.runtime.metrics.clone(),
            },
        );
        store.limiter(|s| s as &mut dyn wasmtime::ResourceLimiter);
        store
    }

    fn instantiate(&self, clock: Clock) -> Result<Warm, CallFailure> {
        self.instantiations.fetch_add(1, Ordering::Relaxed);
        let mut store = self.new_store(clock);
        store.set_epoch_deadline(PolicyRuntime::ticks(self.runtime.limits.init_deadline));
        let policy = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| classify(&store, e))?;
        match policy
            .tidegate_policy_policy()
            .call_init(&mut store, &self.config)
        {
            Ok(Ok(())) => Ok(Warm { store, policy }),
            Ok(Err(msg)) => Err(CallFailure {
                kind: FailureKind::Init,
                detail: msg,
            }),
            Err(e) => Err(classify(&store, e)),
        }
    }

    /// Calls `decide` on the warm instance (instantiating it if needed).
    /// No quarantine bookkeeping: see [`PluginVersion::decide`].
    pub fn call_raw(
        &self,
        event: &sdk::Event,
        clock: Clock,
    ) -> Result<Vec<sdk::Action>, CallFailure> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut guard = self.warm.lock().unwrap();
        let warm = match guard.as_mut() {
            Some(w) => w,
            None => guard.insert(self.instantiate(clock)?),
        };
        let data = warm.store.data_mut();
        data.clock = clock;
        data.logs_left = self.runtime.limits.logs_per_call;
        warm.store
            .set_epoch_deadline(PolicyRuntime::ticks(self.runtime.limits.call_deadline));
        let wit_event = convert::event(event);
        match warm
            .policy
            .tidegate_policy_policy()
            .call_decide(&mut warm.store, &wit_event)
        {
            Ok(actions) => Ok(actions.into_iter().map(convert::action).collect()),
            Err(e) => {
                let failure = classify(&warm.store, e);
                // A trap poisons the store: throw the instance away.
                *guard = None;
                Err(failure)
            }
        }
    }

    /// Like [`PluginVersion::call_raw`], refusing when quarantined and
    /// counting failures toward quarantine.
    pub fn decide(
        &self,
        event: &sdk::Event,
        clock: Clock,
    ) -> Result<Vec<sdk::Action>, CallFailure> {
        if self.is_quarantined() {
            return Err(CallFailure {
                kind: FailureKind::Quarantined,
                detail: format!("{} {} is quarantined", self.name, self.hash),
            });
        }
        let result = self.call_raw(event, clock);
        if result.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            let mut recent = self.recent_failures.lock().unwrap();
            recent.push_back(now);
            while recent
                .front()
                .is_some_and(|t| now.duration_since(*t) > self.quarantine.window)
            {
                recent.pop_front();
            }
            if recent.len() >= self.quarantine.failures {
                self.quarantined.store(true, Ordering::Release);
            }
        }
        result
    }

    pub fn is_quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Acquire)
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Exports and imports of the component, for `tidegate policy check`.
    pub fn interface(&self) -> (Vec<String>, Vec<String>) {
        let ty = self.pre.instance_pre().component().component_type();
        let engine = &self.runtime.engine;
        (
            ty.exports(engine).map(|(n, _)| n.to_owned()).collect(),
            ty.imports(engine).map(|(n, _)| n.to_owned()).collect(),
        )
    }

    /// Instances created since the version was swapped in: 1 after the first
    /// decision, +1 after every failed call.
    pub fn instantiations(&self) -> u64 {
        self.instantiations.load(Ordering::Relaxed)
    }
}

fn classify(store: &Store<HostState>, e: wasmtime::Error) -> CallFailure {
    let kind = if store.data().memory_exceeded {
        FailureKind::Memory
    } else {
        match e.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::Interrupt) => FailureKind::Timeout,
            Some(_) => FailureKind::Trap,
            None => FailureKind::Invalid,
        }
    };
    CallFailure {
        kind,
        detail: one_line(format!("{e:#}")),
    }
}
