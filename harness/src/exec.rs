//! `softverbs exec` and `softverbs env`: run an unmodified libibverbs program (perftest,
//! `ibv_rc_pingpong`, pyverbs, …) on softverbs through the drop-in `libibverbs.so.1`, and an
//! rdma_cm program (rping, ucmatose, `ib_write_bw -R`) through the drop-in `librdmacm.so.1`
//! that `scripts/build-librdmacm.sh` puts in the same directory (one `LD_LIBRARY_PATH` entry
//! serves both; without it there, rdma_cm programs load the system's librdmacm).
//!
//! Both only compute an environment: the library directory first on `LD_LIBRARY_PATH`, and
//! `SOFTVERBS_FAULTS` / `SOFTVERBS_PCAP` (absolute paths) when asked for. `exec` then replaces
//! itself with the program (its exit status is the program's); `env` prints `export` lines for
//! a POSIX shell (`eval "$(softverbs env)"`). Neither builds anything: a missing library is an
//! error (exit 2) that names the build command.
//!
//! The library directory is, in this order: `--lib DIR`, `SOFTVERBS_LIB_DIR`, or
//! `libibverbs/` in the cargo target directory the running `softverbs` binary was built in
//! (`target/release/softverbs` → `target/libibverbs/`), where `scripts/build-libibverbs.sh`
//! puts it (or, when only that exists, the building workspace's `target/libibverbs/`). This module does not load the library or check what it exports; the library reads
//! the variables itself.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable: the directory holding the drop-in `libibverbs.so.1`.
pub const LIB_DIR_ENV: &str = "SOFTVERBS_LIB_DIR";
/// Environment variable the drop-in reads: a fault plan (TOML) its device applies.
pub const FAULTS_ENV: &str = "SOFTVERBS_FAULTS";
/// Environment variable the drop-in reads: a pcap file its device captures to.
pub const PCAP_ENV: &str = "SOFTVERBS_PCAP";
/// The dynamic loader's search path, which gets the library directory prepended.
pub const LD_PATH_ENV: &str = "LD_LIBRARY_PATH";
/// The drop-in's file name (its SONAME).
pub const LIB_NAME: &str = "libibverbs.so.1";
/// The command that builds the drop-in, named in the "library missing" error.
pub const BUILD_COMMAND: &str = "scripts/build-libibverbs.sh --release";
/// The rdma_cm drop-in's file name (its SONAME), next to [`LIB_NAME`].
pub const RDMACM_LIB_NAME: &str = "librdmacm.so.1";
/// The command that builds both drop-ins.
pub const RDMACM_BUILD_COMMAND: &str = "scripts/build-librdmacm.sh --release";

/// Exit code: bad flags, a missing library, an unreadable or invalid fault plan.
pub const EXIT_USAGE: u8 = 2;
/// Exit code of `exec` when the program exists but cannot be executed (as the shell's).
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit code of `exec` when the program is not found (as the shell's).
pub const EXIT_NOT_FOUND: u8 = 127;

/// The options `exec` and `env` share.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct DropInArgs {
    /// Fault plan the program's device applies (emu-fault's TOML: `seed = N` and `[[rule]]`
    /// tables); checked here, passed as SOFTVERBS_FAULTS.
    #[arg(long = "faults", value_name = "PLAN.toml")]
    pub faults: Option<PathBuf>,
    /// Capture the program's RoCEv2 traffic to this pcap file (SOFTVERBS_PCAP); its
    /// directory must exist.
    #[arg(long = "pcap", value_name = "FILE.pcap")]
    pub pcap: Option<PathBuf>,
    /// Directory holding the drop-in libibverbs.so.1 (default: SOFTVERBS_LIB_DIR, else
    /// libibverbs/ in this binary's cargo target directory).
    #[arg(long = "lib", value_name = "DIR")]
    pub lib: Option<PathBuf>,
}

/// Flags of `softverbs exec`.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
#[command(after_help = "Examples:\n  softverbs exec -- ibv_devinfo -v\n  \
    softverbs exec -- ibv_rc_pingpong -g 0                 (terminal 1: server)\n  \
    softverbs exec -- ibv_rc_pingpong -g 0 127.0.0.1       (terminal 2: client)\n  \
    softverbs exec --faults plan.toml --pcap out.pcap -- ib_write_bw -x 0 127.0.0.1\n  \
    softverbs exec -- rping -s -v -C 10 -a 127.0.0.5       (rdma_cm server; needs librdmacm.so.1)\n  \
    softverbs exec -- rping -c -v -C 10 -a 127.0.0.5       (rdma_cm client)")]
pub struct ExecArgs {
    /// Library, fault plan and capture.
    #[command(flatten)]
    pub dropin: DropInArgs,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, value_name = "PROGRAM ARGS")]
    pub command: Vec<OsString>,
}

/// Why the environment could not be set up. Every variant is bad input (exit 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropInError(String);

impl fmt::Display for DropInError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DropInError {}

/// Where the library directory came from, for the error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Flag,
    Env,
    Default,
}

/// The variables to set for the program: `LD_LIBRARY_PATH`'s new first entry and the
/// drop-in's own variables, every path absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropInEnv {
    /// The directory holding `libibverbs.so.1`.
    pub lib_dir: PathBuf,
    /// `SOFTVERBS_FAULTS`, when a plan was given.
    pub faults: Option<PathBuf>,
    /// `SOFTVERBS_PCAP`, when a capture was asked for.
    pub pcap: Option<PathBuf>,
}

impl DropInEnv {
    /// Resolves and checks `args`: the library directory must hold `libibverbs.so.1`, the plan
    /// must be a valid fault plan, the capture's directory must exist. `lib_dir_env` is the
    /// value of [`LIB_DIR_ENV`] (empty = unset).
    pub fn resolve(
        args: &DropInArgs,
        lib_dir_env: Option<&OsStr>,
    ) -> Result<DropInEnv, DropInError> {
        let lib_dir = library_dir(args.lib.as_deref(), lib_dir_env)?;
        let faults = args.faults.as_deref().map(check_plan).transpose()?;
        let pcap = args.pcap.as_deref().map(check_pcap).transpose()?;
        Ok(DropInEnv {
            lib_dir,
            faults,
            pcap,
        })
    }

    /// The variables for a child process, given the current `LD_LIBRARY_PATH`.
    pub fn vars(&self, ld_library_path: Option<&OsStr>) -> Vec<(&'static str, OsString)> {
        let mut path = self.lib_dir.clone().into_os_string();
        if let Some(old) = ld_library_path.filter(|p| !p.is_empty()) {
            path.push(":");
            path.push(old);
        }
        let mut vars = vec![(LD_PATH_ENV, path)];
        vars.extend(self.own_vars());
        vars
    }

    /// `export` lines for a POSIX shell; `LD_LIBRARY_PATH` keeps the shell's value at `eval`
    /// time after the library directory.
    pub fn export_lines(&self) -> String {
        let mut out = format!(
            "export {LD_PATH_ENV}={}${{{LD_PATH_ENV}:+:${LD_PATH_ENV}}}\n",
            shell_quote(self.lib_dir.as_os_str())
        );
        for (name, value) in self.own_vars() {
            out.push_str(&format!("export {name}={}\n", shell_quote(&value)));
        }
        out
    }

    /// Whether the library directory also holds the rdma_cm drop-in ([`RDMACM_LIB_NAME`]).
    pub fn has_rdmacm(&self) -> bool {
        self.lib_dir.join(RDMACM_LIB_NAME).is_file()
    }

    fn own_vars(&self) -> Vec<(&'static str, OsString)> {
        let mut vars = Vec::new();
        if let Some(plan) = &self.faults {
            vars.push((FAULTS_ENV, plan.clone().into_os_string()));
        }
        if let Some(pcap) = &self.pcap {
            vars.push((PCAP_ENV, pcap.clone().into_os_string()));
        }
        vars
    }
}

/// The library directory from the flag, the variable or the binary's target directory,
/// absolute, holding [`LIB_NAME`].
fn library_dir(flag: Option<&Path>, env: Option<&OsStr>) -> Result<PathBuf, DropInError> {
    let (dir, source) = match (flag, env.filter(|v| !v.is_empty())) {
        (Some(dir), _) => (dir.to_path_buf(), Source::Flag),
        (None, Some(dir)) => (PathBuf::from(dir), Source::Env),
        (None, None) => (default_lib_dir()?, Source::Default),
    };
    if !dir.join(LIB_NAME).is_file() {
        let from = match source {
            Source::Flag => "--lib",
            Source::Env => LIB_DIR_ENV,
            Source::Default => "the default, next to this binary",
        };
        return Err(DropInError(format!(
            "no {LIB_NAME} in {} ({from}): build it with `{BUILD_COMMAND}` in the softverbs \
             repository, or name its directory with --lib DIR or {LIB_DIR_ENV}",
            dir.display()
        )));
    }
    dir.canonicalize()
        .map_err(|e| DropInError(format!("{}: {e}", dir.display())))
}

/// Where `scripts/build-libibverbs.sh` puts the library by default: `target/libibverbs` of
/// the workspace this binary was built from.
const WORKSPACE_LIB_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/libibverbs");

/// `libibverbs/` in the cargo target directory of the running binary
/// (`<target>/<profile>/softverbs`) when it holds the library, else the workspace's
/// `target/libibverbs` when that does (a `CARGO_TARGET_DIR` elsewhere), else the former.
pub fn default_lib_dir() -> Result<PathBuf, DropInError> {
    let exe = std::env::current_exe()
        .map_err(|e| DropInError(format!("cannot locate the softverbs binary: {e}")))?;
    let next_to_exe = exe
        .parent()
        .and_then(Path::parent)
        .map(|target| target.join("libibverbs"));
    let workspace = PathBuf::from(WORKSPACE_LIB_DIR);
    match next_to_exe {
        Some(dir) if dir.join(LIB_NAME).is_file() || !workspace.join(LIB_NAME).is_file() => Ok(dir),
        _ => Ok(workspace),
    }
}

/// The plan's absolute path, once it reads as a valid fault plan.
fn check_plan(plan: &Path) -> Result<PathBuf, DropInError> {
    let text = std::fs::read_to_string(plan)
        .map_err(|e| DropInError(format!("--faults {}: {e}", plan.display())))?;
    emu_fault::FaultPlan::from_toml(&text)
        .map_err(|e| DropInError(format!("--faults {}: {e}", plan.display())))?;
    absolute(plan)
}

/// The capture's absolute path, once its directory exists.
fn check_pcap(pcap: &Path) -> Result<PathBuf, DropInError> {
    let path = absolute(pcap)?;
    match path.parent() {
        Some(dir) if dir.is_dir() && path.file_name().is_some() => Ok(path),
        _ => Err(DropInError(format!(
            "--pcap {}: not a file name in an existing directory",
            pcap.display()
        ))),
    }
}

fn absolute(path: &Path) -> Result<PathBuf, DropInError> {
    std::path::absolute(path).map_err(|e| DropInError(format!("{}: {e}", path.display())))
}

/// `value` in single quotes for a POSIX shell (`'` becomes `'\''`).
fn shell_quote(value: &OsStr) -> String {
    let text = String::from_utf8_lossy(value.as_bytes());
    format!("'{}'", text.replace('\'', r"'\''"))
}

fn resolve_from_process(args: &DropInArgs) -> Result<DropInEnv, u8> {
    DropInEnv::resolve(args, std::env::var_os(LIB_DIR_ENV).as_deref()).map_err(|e| {
        eprintln!("softverbs: {e}");
        EXIT_USAGE
    })
}

/// `softverbs exec`: replaces this process with the program in the drop-in's environment.
/// Returns only on failure: 2 bad input, 126 the program cannot be executed, 127 not found.
pub fn exec(args: &ExecArgs) -> u8 {
    let env = match resolve_from_process(&args.dropin) {
        Ok(env) => env,
        Err(code) => return code,
    };
    let Some((program, rest)) = args.command.split_first() else {
        eprintln!("softverbs exec: no program given (softverbs exec -- PROGRAM ARGS…)");
        return EXIT_USAGE;
    };
    let vars = env.vars(std::env::var_os(LD_PATH_ENV).as_deref());
    let err = Command::new(program).args(rest).envs(vars).exec();
    eprintln!("softverbs exec: {}: {err}", Path::new(program).display());
    if err.kind() == std::io::ErrorKind::NotFound {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_EXECUTE
    }
}

/// `softverbs env`: prints the `export` lines. Exit code: 0, or 2 on bad input.
pub fn env(args: &DropInArgs) -> u8 {
    match resolve_from_process(args) {
        Ok(env) => {
            use std::io::Write as _;
            let _ = std::io::stdout().write_all(env.export_lines().as_bytes());
            0
        }
        Err(code) => code,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn env_at(dir: &str) -> DropInEnv {
        DropInEnv {
            lib_dir: PathBuf::from(dir),
            faults: None,
            pcap: None,
        }
    }

    #[test]
    fn the_library_directory_goes_first_on_the_loader_path() {
        let env = env_at("/x/lib");
        assert_eq!(env.vars(None)[0].1, "/x/lib");
        assert_eq!(env.vars(Some(OsStr::new("")))[0].1, "/x/lib");
        assert_eq!(env.vars(Some(OsStr::new("/a:/b")))[0].1, "/x/lib:/a:/b");
        assert_eq!(env.vars(None).len(), 1, "no fault plan, no capture");
    }

    #[test]
    fn export_lines_quote_for_the_shell() {
        let mut env = env_at("/it's/lib");
        env.pcap = Some(PathBuf::from("/tmp/a b.pcap"));
        assert_eq!(
            env.export_lines(),
            "export LD_LIBRARY_PATH='/it'\\''s/lib'${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\n\
             export SOFTVERBS_PCAP='/tmp/a b.pcap'\n"
        );
    }

    #[test]
    fn the_rdmacm_drop_in_is_found_next_to_libibverbs() {
        let dir =
            std::env::temp_dir().join(format!("softverbs-exec-rdmacm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(LIB_NAME), b"").unwrap();
        let args = DropInArgs {
            lib: Some(dir.clone()),
            ..DropInArgs::default()
        };
        let env = DropInEnv::resolve(&args, None).unwrap();
        assert!(!env.has_rdmacm());
        std::fs::write(dir.join(RDMACM_LIB_NAME), b"").unwrap();
        assert!(env.has_rdmacm());
        assert!(
            env.vars(None)[0]
                .1
                .to_string_lossy()
                .starts_with(&*env.lib_dir.to_string_lossy())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_without_the_library_names_the_build_command() {
        let dir = std::env::temp_dir();
        let args = DropInArgs {
            lib: Some(dir.join("softverbs-no-such-dir")),
            ..DropInArgs::default()
        };
        let err = DropInEnv::resolve(&args, None).unwrap_err().to_string();
        assert!(err.contains(BUILD_COMMAND), "{err}");
        assert!(err.contains("--lib"), "{err}");
        let err = DropInEnv::resolve(&DropInArgs::default(), Some(dir.as_os_str()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(LIB_DIR_ENV), "{err}");
    }
}
