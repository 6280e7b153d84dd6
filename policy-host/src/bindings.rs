//! The host bindings of the `tidegate:policy` WIT packages, generated here
//! and nowhere else: one module per contract version the host implements.
//! Every version shares the `types` interface (0.2.0 changed only `init`,
//! 0.3.0 only how `decide` receives the event), so the later bindings
//! reuse 0.1.0's types and one converter serves them all.
//!
//! All are generated `Borrowing`: a 0.1.0 or 0.2.0 event's strings and
//! lists are `&str` and slices borrowed from the gateway's own event
//! (`convert.rs`), and a 0.3.0 event is a slice of the encoded buffer, so
//! the host copies nothing before wasmtime copies it into the sandbox.
//! Types the host receives (actions, `metadata-reads`) stay owned.

/// `tidegate:policy@0.1.0`, frozen in `sdk/wit-history/0.1.0/`.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../sdk/wit-history/0.1.0",
        world: "drain-policy",
        ownership: Borrowing { duplicate_if_necessary: true },
    });
}

/// `tidegate:policy@0.2.0`, frozen in `sdk/wit-history/0.2.0/`.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../sdk/wit-history/0.2.0",
        world: "drain-policy",
        ownership: Borrowing { duplicate_if_necessary: true },
        with: {
            "tidegate:policy/types": super::v0_1::tidegate::policy::types,
        },
    });
}

/// `tidegate:policy@0.3.0` (`sdk/wit/`, the SDK's): `decide` takes the
/// event encoded (`tidegate_sdk::wire`).
pub mod v0_3 {
    wasmtime::component::bindgen!({
        path: "../sdk/wit",
        world: "drain-policy",
        ownership: Borrowing { duplicate_if_necessary: true },
        with: {
            "tidegate:policy/types": super::v0_1::tidegate::policy::types,
        },
    });
}

/// The types every contract version shares.
pub use v0_1::tidegate::policy::types;
