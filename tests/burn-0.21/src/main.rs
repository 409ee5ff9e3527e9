//! qcli's files in the older published Burn 0.21.0, for `--burn-version 0.21`: opens burnpack files
//! the way a Burn user does, on a chosen backend, and writes what Burn decoded as f32 safetensors.
//! The `dequantize`, `probe` and `compute` commands and their output are those of tests/burn (Burn 0.22).
//! Built with the `cuda` feature it also runs on Burn's CUDA backend (`--backend cuda`).
//!
//! ```text
//! burn-harness-021 dequantize --backend BACKEND IN.bpk OUT.safetensors
//! burn-harness-021 probe      --backend BACKEND IN.bpk OUT.safetensors    (one verdict per tensor)
//! burn-harness-021 compute    --backend BACKEND IN.bpk                 (one verdict per tensor and op)
//! burn-harness-021 version                                              (burn-store's, as linked)
//! ```

#[path = "../../burn/common/cli.rs"]
mod cli;
#[path = "../../burn/common/ops.rs"]
mod ops;
#[path = "../../burn/common/report.rs"]
mod report;

mod backend;
mod compute;
mod decode;

use std::path::Path;
use std::process::ExitCode;

use burn::tensor::backend::Backend;
use burn_store::BurnpackStore;

use crate::cli::{Args, Failure};

const USAGE: &str = "usage:
  burn-harness-021 dequantize --backend BACKEND IN.bpk OUT.safetensors
  burn-harness-021 probe --backend BACKEND IN.bpk OUT.safetensors
  burn-harness-021 compute --backend BACKEND IN.bpk
  burn-harness-021 version";

/// `dequantize` or `probe` of one file, run on whichever backend is named.
struct Decode<'a> {
    probe: bool,
    input: &'a Path,
    output: &'a Path,
}

impl backend::Command for Decode<'_> {
    fn run<B: Backend>(self, device: &B::Device) -> Result<(), String> {
        let tensors = decode::open(self.input)?;
        let decoded = if self.probe {
            report::probe_each(tensors, |data| decode::decode::<B>(device, data))
        } else {
            report::decode_all(tensors, |data| decode::decode::<B>(device, data))?
        };
        report::write_f32(self.output, &decoded)
    }
}

/// `compute` of one file, run on whichever backend is named.
struct Compute<'a> {
    input: &'a Path,
}

impl backend::Command for Compute<'_> {
    fn run<B: Backend>(self, device: &B::Device) -> Result<(), String> {
        compute::compute::<B>(device, self.input)
    }
}

fn backend_name(args: &Args) -> Result<backend::Name, Failure> {
    backend::parse(args.option("backend")?).map_err(Failure::Usage)
}

fn run(args: &Args) -> Result<(), Failure> {
    match args.command.as_str() {
        "version" => {
            println!("{}", BurnpackStore::default_metadata()["version"]);
            Ok(())
        }
        command @ ("dequantize" | "probe") => {
            let [input, output] = args.paths()?;
            Ok(backend::run(
                &backend_name(args)?,
                Decode {
                    probe: command == "probe",
                    input,
                    output,
                },
            )?)
        }
        "compute" => {
            let [input] = args.paths()?;
            Ok(backend::run(&backend_name(args)?, Compute { input })?)
        }
        other => Err(Failure::Usage(format!("unknown command {other:?}"))),
    }
}

fn main() -> ExitCode {
    cli::main(&format!("{USAGE}\nbackends: {}", backend::NAMES), run)
}
