//! The Burn 0.23 backends the harness loads files on, by the names qcli's `--burn-backend` uses.
//!
//! 0.23 is tests/burn's src/backend.rs less ndarray: Burn 0.23.0-pre.1's `burn` crate has no `ndarray`
//! feature and `Device` no `ndarray()` constructor, so that name is refused with the reason.

use burn::prelude::*;

/// The backend names this build has, for the usage.
pub const NAMES: &str = "flex, wgpu (ndarray: not in Burn 0.23)";

/// The device of backend `name`: Burn's pure-Rust CPU backend (`flex`) or the CubeCL wgpu backend (on
/// the CPU through a Vulkan driver such as lavapipe).
pub fn device(name: &str) -> Result<Device, String> {
    match name {
        "flex" => Ok(Device::flex()),
        "wgpu" => Ok(Device::wgpu(DeviceKind::DefaultDevice)),
        "ndarray" => Err("Burn 0.23 has no ndarray backend (the burn crate dropped its feature)".into()),
        other => Err(format!("unknown backend {other:?}")),
    }
}
