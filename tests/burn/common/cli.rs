//! The command line both harnesses share (tests/burn for Burn 0.22, tests/burn-0.21 for 0.21):
//! `COMMAND [--name value]... PATH...`, and why a command stopped.

use std::path::PathBuf;

/// Why a command stopped: the command line was wrong (the usage follows), or Burn or a file failed.
pub enum Failure {
    Usage(String),
    Run(String),
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure::Run(message)
    }
}

/// A command line split into its `--name value` options and its positional paths.
pub struct Args {
    pub command: String,
    options: Vec<(String, String)>,
    paths: Vec<PathBuf>,
}

impl Args {
    pub fn parse(mut raw: impl Iterator<Item = String>) -> Result<Self, Failure> {
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

    pub fn option(&self, name: &str) -> Result<&str, Failure> {
        self.options
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
            .ok_or(Failure::Usage(format!("{} needs --{name}", self.command)))
    }

    pub fn paths<const N: usize>(&self) -> Result<[&PathBuf; N], Failure> {
        let paths: Vec<&PathBuf> = self.paths.iter().collect();
        paths.try_into().map_err(|_| {
            Failure::Usage(format!(
                "{} takes {N} paths, got {}",
                self.command,
                self.paths.len()
            ))
        })
    }
}

/// Runs `run` on the process's arguments: status 0, 2 with the usage for a wrong command line, or 1
/// with the message for anything else.
pub fn main(usage: &str, run: impl FnOnce(&Args) -> Result<(), Failure>) -> std::process::ExitCode {
    match Args::parse(std::env::args().skip(1)).and_then(|args| run(&args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}\n{usage}");
            std::process::ExitCode::from(2)
        }
        Err(Failure::Run(message)) => {
            eprintln!("error: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}
