//! The Burn 0.21 backends the harness loads files on, by the names qcli's `--burn-backend` uses.
//!
//! Burn 0.21 has no backend-erased `Device`: every tensor is `Tensor<B, D>` for a backend type `B`,
//! so a command is run once, generic over `B`, with the backend picked by name.

use burn::backend::{Flex, NdArray, Wgpu};
use burn::tensor::backend::Backend;

/// The backends by name: Burn's pure-Rust CPU backend (`flex`), the ndarray backend, or the
/// CubeCL wgpu backend (on the CPU through a Vulkan driver such as lavapipe).
pub enum Name {
    Flex,
    NdArray,
    Wgpu,
}

pub fn parse(name: &str) -> Result<Name, String> {
    match name {
        "flex" => Ok(Name::Flex),
        "ndarray" => Ok(Name::NdArray),
        "wgpu" => Ok(Name::Wgpu),
        other => Err(format!("unknown backend {other:?}")),
    }
}

/// A command generic over the backend, run on the backend named `name` and its default device.
pub trait Command {
    fn run<B: Backend>(self, device: &B::Device) -> Result<(), String>;
}

pub fn run(name: &Name, command: impl Command) -> Result<(), String> {
    match name {
        Name::Flex => command.run::<Flex>(&Default::default()),
        Name::NdArray => command.run::<NdArray>(&Default::default()),
        // The default wgpu device: the best adapter wgpu finds (lavapipe on a machine without a GPU).
        Name::Wgpu => command.run::<Wgpu>(&Default::default()),
    }
}
