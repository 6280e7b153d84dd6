//! One loaded version of a plugin: compiled once, instantiated from a cached
//! `InstancePre`, one warm instance reused across calls. A failed call
//! discards the instance (a trap poisons a component store); the next call
//! re-instantiates. Repeated failures quarantine the version. A plugin of
//! any contract version the host implements is served by that version's
//! bindings; a 0.2.0 or 0.3.0 plugin's `init` says which labels and
//! annotations each event carries, and a 0.3.0 plugin gets the event
//! encoded in one buffer (`tidegate_sdk::wire`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tidegate_base::sync::Locked;
use tidegate_sdk as sdk;
use tracing::info;
use wasmtime::component::Component;
use wasmtime::Store;

use super::bindings::{v0_1, v0_2, v0_3};
use super::convert;
use super::error::{one_line, CallFailure, FailureKind, LoadError};
use super::metrics::DecisionSeries;
use super::runtime::{Clock, HostState, PolicyRuntime};
use super::version::{self, Contract, Version};

/// At most this many label keys, and as many annotation keys, in a
/// plugin's `metadata-reads` (more is refused at `init`).
pub const MAX_READ_KEYS: usize = 64;
/// The longest Kubernetes label or annotation key (253-byte prefix, `/`,
/// 63-byte name).
const MAX_KEY_LEN: usize = 317;

/// The largest encoded event whose buffer a warm instance keeps for the
/// next call. A typical pod event is a few hundred bytes; a larger buffer
/// (a `gateway-shutdown` listing many pods with every annotation) is freed
/// after its call rather than held for the plugin version's life.
const KEEP_WIRE_BYTES: usize = 64 * 1024;

/// After a call: keeps `wire`'s memory for the next event unless one
/// large event grew it past [`KEEP_WIRE_BYTES`].
fn release_if_large(wire: &mut Vec<u8>) {
    if wire.capacity() > KEEP_WIRE_BYTES {
        *wire = Vec::new();
    }
}

/// The compiled plugin, ready to instantiate, through its contract's bindings.
enum Pre {
    V0_1(v0_1::DrainPolicyPre<HostState>),
    V0_2(v0_2::DrainPolicyPre<HostState>),
    V0_3(v0_3::DrainPolicyPre<HostState>),
}

enum Instance {
    V0_1(v0_1::DrainPolicy),
    V0_2(v0_2::DrainPolicy),
    V0_3(v0_3::DrainPolicy),
}

/// Bounds a plugin's declared reads; the error names what is wrong.
fn check_reads(reads: &sdk::MetadataReads) -> Result<(), String> {
    for (what, keys) in [
        ("labels", &reads.labels),
        ("annotations", &reads.annotations),
    ] {
        let sdk::Keys::Only(keys) = keys else {
            continue;
        };
        if keys.len() > MAX_READ_KEYS {
            return Err(format!(
                "metadata-reads.{what}: {} keys, at most {MAX_READ_KEYS} (or [\"*\"] for every key)",
                keys.len()
            ));
        }
        if let Some(k) = keys.iter().find(|k| k.is_empty() || k.len() > MAX_KEY_LEN) {
            return Err(format!(
                "metadata-reads.{what}: key {k:?} is not a Kubernetes key (1 to {MAX_KEY_LEN} bytes)"
            ));
        }
    }
    Ok(())
}

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
    policy: Instance,
    /// What this instance's `init` declared it reads, in key order
    /// (`/policies` shows them as declared).
    reads: sdk::MetadataReads,
    /// A 0.3.0 event's encoding, reused from call to call.
    wire: Vec<u8>,
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
    pre: Pre,
    /// The reads of the last successful `init`, for `/policies`.
    reads: Mutex<Option<sdk::MetadataReads>>,
    warm: Mutex<Option<Warm>>,
    quarantine: QuarantineRule,
    recent_failures: Mutex<VecDeque<Instant>>,
    quarantined: AtomicBool,
    calls: AtomicU64,
    failures: AtomicU64,
    instantiations: AtomicU64,
    /// Its decisions' metric series, looked up once.
    pub(super) series: DecisionSeries,
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
        *version.warm.locked() = None;
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
        let (contract, bindings) = version::check(&runtime.engine, &component)?;
        if let Some(retiring) = version::retired_by(contract) {
            info!(
                policy = name,
                %contract,
                retired_by = %retiring,
                newest = version::HOST_CONTRACT,
                "plugin built for an older contract: it loads until the gateway implements \
                 contract {retiring}; rebuild it with the current tidegate-sdk"
            );
        }
        let instantiate_err =
            |e: wasmtime::Error| LoadError::Instantiate(one_line(format!("{e:#}")));
        let instance_pre = runtime
            .linker
            .instantiate_pre(&component)
            .map_err(instantiate_err)?;
        let pre = match bindings {
            Contract::V0_1 => {
                Pre::V0_1(v0_1::DrainPolicyPre::new(instance_pre).map_err(instantiate_err)?)
            }
            Contract::V0_2 => {
                Pre::V0_2(v0_2::DrainPolicyPre::new(instance_pre).map_err(instantiate_err)?)
            }
            Contract::V0_3 => {
                Pre::V0_3(v0_3::DrainPolicyPre::new(instance_pre).map_err(instantiate_err)?)
            }
        };
        let version = Arc::new(PluginVersion {
            name: name.to_owned(),
            hash: digest(bytes, config),
            config: config.to_owned(),
            contract,
            loaded_at: SystemTime::now(),
            size: bytes.len(),
            runtime: runtime.clone(),
            pre,
            reads: Mutex::new(None),
            warm: Mutex::new(None),
            quarantine,
            recent_failures: Mutex::new(VecDeque::new()),
            quarantined: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            instantiations: AtomicU64::new(0),
            series: DecisionSeries::new(&runtime.metrics, name),
        });
        let warm = version.instantiate(clock).map_err(|f| match f.kind {
            FailureKind::Init => LoadError::Init(one_line(f.detail)),
            _ => LoadError::Instantiate(f.to_string()),
        })?;
        *version.warm.locked() = Some(warm);
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
        let _busy = self.runtime.busy();
        let mut store = self.new_store(clock);
        store.set_epoch_deadline(PolicyRuntime::ticks(self.runtime.limits.init_deadline));
        // Each contract's bindings are their own types: the same steps,
        // written once. `$reads` turns what `init` returned into the SDK's
        // reads (a 0.1.0 plugin declares none and gets every key).
        macro_rules! instantiate_with {
            ($pre:expr, $instance:path, $reads:expr) => {{
                let p = $pre
                    .instantiate(&mut store)
                    .map_err(|e| classify(&store, e))?;
                let init = p
                    .tidegate_policy_policy()
                    .call_init(&mut store, &self.config)
                    .map(|r| r.map($reads));
                ($instance(p), init)
            }};
        }
        let (policy, init) = match &self.pre {
            Pre::V0_1(pre) => instantiate_with!(pre, Instance::V0_1, |()| {
                sdk::MetadataReads::everything()
            }),
            Pre::V0_2(pre) => instantiate_with!(pre, Instance::V0_2, sdk::MetadataReads::from),
            Pre::V0_3(pre) => instantiate_with!(pre, Instance::V0_3, sdk::MetadataReads::from),
        };
        let init_failure = |detail: String| CallFailure {
            kind: FailureKind::Init,
            detail,
        };
        match init {
            Ok(Ok(reads)) => {
                check_reads(&reads).map_err(init_failure)?;
                *self.reads.locked() = Some(reads.clone());
                Ok(Warm {
                    store,
                    policy,
                    reads: reads.in_key_order(),
                    wire: Vec::new(),
                })
            }
            Ok(Err(msg)) => Err(init_failure(msg)),
            Err(e) => Err(classify(&store, e)),
        }
    }

    /// What the plugin's last successful `init` declared it reads (every
    /// key for a 0.1.0 plugin).
    pub fn reads(&self) -> Option<sdk::MetadataReads> {
        self.reads.locked().clone()
    }

    /// Calls `decide` on the warm instance (instantiating it if needed).
    /// No quarantine bookkeeping: see [`PluginVersion::decide`].
    pub fn call_raw(
        &self,
        event: &sdk::Event,
        clock: Clock,
    ) -> Result<Vec<sdk::Action>, CallFailure> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut guard = self.warm.locked();
        let _busy = self.runtime.busy();
        let warm = match guard.as_mut() {
            Some(w) => w,
            None => guard.insert(self.instantiate(clock)?),
        };
        let data = warm.store.data_mut();
        data.clock = clock;
        data.logs_left = self.runtime.limits.logs_per_call;
        warm.store
            .set_epoch_deadline(PolicyRuntime::ticks(self.runtime.limits.call_deadline));
        let decided = match &warm.policy {
            Instance::V0_1(p) => convert::with_event(event, &warm.reads, |e| {
                p.tidegate_policy_policy().call_decide(&mut warm.store, e)
            }),
            Instance::V0_2(p) => convert::with_event(event, &warm.reads, |e| {
                p.tidegate_policy_policy().call_decide(&mut warm.store, e)
            }),
            Instance::V0_3(p) => {
                warm.wire.clear();
                sdk::wire::encode_event(event, &warm.reads, &mut warm.wire);
                let decided = p
                    .tidegate_policy_policy()
                    .call_decide(&mut warm.store, &warm.wire);
                release_if_large(&mut warm.wire);
                decided
            }
        };
        match decided {
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
            let mut recent = self.recent_failures.locked();
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
        let component = match &self.pre {
            Pre::V0_1(pre) => pre.instance_pre().component(),
            Pre::V0_2(pre) => pre.instance_pre().component(),
            Pre::V0_3(pre) => pre.instance_pre().component(),
        };
        let ty = component.component_type();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_event_buffer_is_freed_a_typical_one_kept() {
        let mut typical = Vec::with_capacity(512);
        typical.extend_from_slice(&[1; 300]);
        typical.clear();
        let kept = typical.capacity();
        release_if_large(&mut typical);
        assert_eq!(typical.capacity(), kept, "kept for the next event");

        let mut large: Vec<u8> = Vec::with_capacity(KEEP_WIRE_BYTES + 1);
        assert!(large.capacity() > KEEP_WIRE_BYTES);
        release_if_large(&mut large);
        assert_eq!(large.capacity(), 0, "freed after its call");
    }
}
