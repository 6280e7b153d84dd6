//! Drain-policy plugins from source to component, shared by the gateway's
//! `tidegate-plugin new|build` and `cargo xtask plugins`, so there is one
//! componentization and one import check:
//!
//! - [`component`]: core module → component (`wit-component`), refusing
//!   anything that imports outside `tidegate:policy/…` or does not export
//!   the policy;
//! - [`cargo`]: `cargo metadata` and `cargo build --target wasm32-unknown-unknown`;
//! - [`wasm_target`]: the wasm32 standard library, installed with rustup if missing;
//! - [`build_crate`]: all of that for one crate (`tidegate-plugin build`);
//! - [`configmap`]: whether a component fits the `tidegate-plugins` ConfigMap;
//! - [`new`]: a new standalone policy crate (`tidegate-plugin new`).
//!
//! No wasmtime here: xtask links this crate without the gateway.

#![forbid(unsafe_code)]

pub mod build_crate;
pub mod cargo;
pub mod component;
pub mod configmap;
pub mod new;
pub mod wasm_target;

pub use wasm_target::WASM_TARGET;
