//! Seeds from the environment: how a failing run is replayed.

use verbs_api::{Error, Result};

use crate::SEED_ENV;

/// Parses a seed: decimal, or hexadecimal with a `0x` prefix.
pub(crate) fn parse_seed(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// The seed [`SEED_ENV`] holds, if set.
pub(crate) fn env_seed() -> Result<Option<u64>> {
    match std::env::var(SEED_ENV) {
        Ok(text) => parse_seed(&text).map(Some).ok_or_else(|| {
            Error::invalid(format!(
                "{SEED_ENV}={text:?} is not a seed (decimal, or hex with 0x)"
            ))
        }),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(Error::invalid(format!("{SEED_ENV} is not valid UTF-8")))
        }
    }
}

/// The seed for a test run: [`SEED_ENV`] if set, else `default`. Prints
/// `SOFTVERBS_SEED=<seed>` to stderr, which the test harness shows when the test fails: set the
/// variable to that value to replay the run. An unparsable variable is reported on stderr and
/// `default` is used.
pub fn seed_from_env(default: u64) -> u64 {
    let seed = match env_seed() {
        Ok(seed) => seed.unwrap_or(default),
        Err(e) => {
            eprintln!("softverbs: ignoring {e}");
            default
        }
    };
    eprintln!("{SEED_ENV}={seed}  (set it to replay this run)");
    seed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_decimal_and_hex() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed(" 0x2a "), Some(42));
        assert_eq!(parse_seed("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_seed("-1"), None);
        assert_eq!(parse_seed("0x"), None);
        assert_eq!(parse_seed("seed"), None);
    }
}
