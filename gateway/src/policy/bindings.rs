//! The host bindings of the `tidegate:policy` WIT packages, generated here
//! and nowhere else: one module per contract version the host implements.
//! Every version has the same log level and actions (0.1.0's `types`
//! interface), so the later versions' bindings reuse 0.1.0's Rust types and
//! one action converter serves all three. 0.2.0 changed only `init`; 0.3.0
//! moved the event types into `events`, with strings as spans of a text.

/// `tidegate:policy@0.1.0`, frozen in `sdk/wit-history/0.1.0/`.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../sdk/wit-history/0.1.0",
        world: "drain-policy",
    });
}

/// `tidegate:policy@0.2.0`, frozen in `sdk/wit-history/0.2.0/`.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../sdk/wit-history/0.2.0",
        world: "drain-policy",
        with: {
            "tidegate:policy/types": super::v0_1::tidegate::policy::types,
        },
    });
}

/// `tidegate:policy@0.3.0` (`sdk/wit/`, the SDK's).
pub mod v0_3 {
    wasmtime::component::bindgen!({
        path: "../sdk/wit",
        world: "drain-policy",
        with: {
            "tidegate:policy/types": super::v0_1::tidegate::policy::types,
        },
    });
}

/// The types every contract version shares (and 0.1.0's and 0.2.0's events).
pub use v0_1::tidegate::policy::types;
/// 0.3.0's events: strings as spans of the text passed with the event.
pub use v0_3::tidegate::policy::events;
