//! Burn's side of qcli's conformance tests: opens burnpack files the way a Burn user does, on a
//! chosen backend of the published Burn release, and writes what Burn decoded as f32 safetensors.
//!
//! ```text
//! burn-harness dequantize --backend BACKEND IN.bpk OUT.safetensors
//! burn-harness probe      --backend BACKEND IN.bpk OUT.safetensors    (one verdict per tensor)
//! burn-harness forward    --backend BACKEND --layout row|col IN.bpk X.safetensors OUT.safetensors
//! burn-harness write-fixture --backend BACKEND [--scheme JSON] IN.safetensors OUT.bpk
//! burn-harness version                                              (burn-store's, as linked)
//! ```
//!
//! A Burn panic or error ends the command with a non-zero status and Burn's message on stderr.

mod backend;
mod decode;
mod model;
mod tensors;

use std::path::PathBuf;

use burn_store::BurnpackStore;
use std::process::ExitCode;

const USAGE: &str = "usage:
  burn-harness dequantize --backend BACKEND IN.bpk OUT.safetensors
  burn-harness probe --backend BACKEND IN.bpk OUT.safetensors
  burn-harness forward --backend BACKEND --layout row|col IN.bpk X.safetensors OUT.safetensors
  burn-harness write-fixture --backend BACKEND [--scheme JSON] IN.safetensors OUT.bpk
  burn-harness version
backends: flex, ndarray, wgpu";

/// Why a command stopped: the command line was wrong (the usage follows), or Burn or a file failed.
enum Failure {
    Usage(String),
    Run(String),
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure::Run(message)
    }
}

/// A command line split into its `--name value` options and its positional paths.
struct Args {
    command: String,
    options: Vec<(String, String)>,
    paths: Vec<PathBuf>,
}

impl Args {
    fn parse(mut raw: impl Iterator<Item = String>) -> Result<Self, Failure> {
        let command = raw
            .next()
            .ok_or(Failure::Usage("no command given".into()))?;
        let (mut options, mut paths) = (Vec::new(), Vec::new());
        while let Some(arg) = raw.next() {
            match arg.strip_prefix("--") {
                Some(name) => {
                    let value = raw
                        .next()
                        .ok_or(Failure::Usage(format!("--{name} takes a value")))?;
                    options.push((name.to_string(), value));
                }
                None => paths.push(PathBuf::from(arg)),
            }
        }
        Ok(Self {
            command,
            options,
            paths,
        })
    }

    fn option(&self, name: &str) -> Result<&str, Failure> {
        self.options
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
            .ok_or(Failure::Usage(format!("{} needs --{name}", self.command)))
    }

    fn paths<const N: usize>(&self) -> Result<[&PathBuf; N], Failure> {
        let paths: Vec<&PathBuf> = self.paths.iter().collect();
        paths.try_into().map_err(|_| {
            Failure::Usage(format!(
                "{} takes {N} paths, got {}",
                self.command,
                self.paths.len()
            ))
        })
    }

    fn device(&self) -> Result<burn::prelude::Device, Failure> {
        backend::device(self.option("backend")?).map_err(Failure::Usage)
    }
}

fn run(args: &Args) -> Result<(), Failure> {
    match args.command.as_str() {
        "version" => {
            println!("{}", BurnpackStore::default_metadata()["version"]);
            Ok(())
        }
        "dequantize" => {
            let [input, output] = args.paths()?;
            Ok(decode::dequantize(&args.device()?, input, output)?)
        }
        "probe" => {
            let [input, output] = args.paths()?;
            Ok(decode::probe(&args.device()?, input, output)?)
        }
        "forward" => {
            let [weights, input, output] = args.paths()?;
            let layout = model::layout(args.option("layout")?).map_err(Failure::Usage)?;
            Ok(model::forward(
                &args.device()?,
                layout,
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
            Ok(model::write_fixture(
                &args.device()?,
                scheme,
                input,
                output,
            )?)
        }
        other => Err(Failure::Usage(format!("unknown command {other:?}"))),
    }
}

fn main() -> ExitCode {
    let result = Args::parse(std::env::args().skip(1)).and_then(|args| run(&args));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Run(message)) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
