//! Burn's side of qcli's conformance tests: opens burnpack files the way a Burn user does, on a
//! chosen backend of the published Burn release, and writes what Burn decoded as f32 safetensors.
//!
//! ```text
//! burn-harness dequantize --backend BACKEND IN.bpk OUT.safetensors
//! burn-harness probe      --backend BACKEND IN.bpk OUT.safetensors    (one verdict per tensor)
//! burn-harness forward    --backend BACKEND --layout row|col IN.bpk X.safetensors OUT.safetensors
//! burn-harness compute    --backend BACKEND IN.bpk                 (one verdict per tensor and op)
//! burn-harness block      --backend BACKEND --layout row|col --heads N IN.bpk IDS.safetensors OUT.safetensors
//! burn-harness write-fixture --backend BACKEND [--scheme JSON] IN.safetensors OUT.bpk
//! burn-harness version                                              (burn-store's, as linked)
//! ```
//!
//! A Burn panic or error ends the command with a non-zero status and Burn's message on stderr.

#[path = "../common/cli.rs"]
mod cli;
#[path = "../common/ops.rs"]
mod ops;
#[path = "../common/report.rs"]
mod report;

mod backend;
mod block;
mod compute;
mod decode;
mod model;
mod tensors;

use std::process::ExitCode;

use burn_store::BurnpackStore;

use crate::cli::{Args, Failure};

const USAGE: &str = "usage:
  burn-harness dequantize --backend BACKEND IN.bpk OUT.safetensors
  burn-harness probe --backend BACKEND IN.bpk OUT.safetensors
  burn-harness forward --backend BACKEND --layout row|col IN.bpk X.safetensors OUT.safetensors
  burn-harness compute --backend BACKEND IN.bpk
  burn-harness block --backend BACKEND --layout row|col --heads N IN.bpk IDS.safetensors OUT.safetensors
  burn-harness write-fixture --backend BACKEND [--scheme JSON] IN.safetensors OUT.bpk
  burn-harness version
backends: flex, ndarray, wgpu";

fn device(args: &Args) -> Result<burn::prelude::Device, Failure> {
    backend::device(args.option("backend")?).map_err(Failure::Usage)
}

fn run(args: &Args) -> Result<(), Failure> {
    match args.command.as_str() {
        "version" => {
            println!("{}", BurnpackStore::default_metadata()["version"]);
            Ok(())
        }
        "dequantize" => {
            let [input, output] = args.paths()?;
            Ok(decode::dequantize(&device(args)?, input, output)?)
        }
        "probe" => {
            let [input, output] = args.paths()?;
            Ok(decode::probe(&device(args)?, input, output)?)
        }
        "forward" => {
            let [weights, input, output] = args.paths()?;
            let layout = model::layout(args.option("layout")?).map_err(Failure::Usage)?;
            Ok(model::forward(
                &device(args)?,
                layout,
                weights,
                input,
                output,
            )?)
        }
        "compute" => {
            let [input] = args.paths()?;
            Ok(compute::compute(&device(args)?, input)?)
        }
        "block" => {
            let [weights, input, output] = args.paths()?;
            let layout = model::layout(args.option("layout")?).map_err(Failure::Usage)?;
            let heads = args
                .option("heads")?
                .parse()
                .map_err(|_| Failure::Usage("--heads takes a count".into()))?;
            Ok(block::forward(
                &device(args)?,
                layout,
                heads,
                weights,
                input,
                output,
            )?)
        }
        "write-fixture" => {
            let [input, output] = args.paths()?;
            let scheme = match args.option("scheme") {
                Ok(json) => Some(serde_json::from_str(json).map_err(|err| {
                    Failure::Usage(format!("--scheme is not a Burn QuantScheme: {err}"))
                })?),
                Err(_) => None,
            };
            Ok(model::write_fixture(&device(args)?, scheme, input, output)?)
        }
        other => Err(Failure::Usage(format!("unknown command {other:?}"))),
    }
}

fn main() -> ExitCode {
    cli::main(USAGE, run)
}
