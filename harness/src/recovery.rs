//! `--recovery ibta|sr`: the loss recovery a harness command asks of its RC QPs (selective
//! repeat is a softverbs extension both ends must enable; `verbs_api::Recovery`).

use serde::{Deserialize, Serialize};
use verbs_api::Recovery;

/// The `--recovery` flag's values.
#[derive(
    clap::ValueEnum, Serialize, Deserialize, Copy, Clone, Debug, Default, PartialEq, Eq, Hash,
)]
pub enum RecoveryArg {
    /// IBTA go-back-N (what RDMA hardware does).
    #[default]
    #[value(name = "ibta")]
    #[serde(rename = "ibta")]
    Ibta,
    /// Selective repeat (softverbs extension; both ends).
    #[value(name = "sr")]
    #[serde(rename = "sr")]
    Sr,
}

impl RecoveryArg {
    /// The QP attribute value.
    pub fn recovery(self) -> Recovery {
        match self {
            RecoveryArg::Ibta => Recovery::Ibta,
            RecoveryArg::Sr => Recovery::SelectiveRepeat,
        }
    }

    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            RecoveryArg::Ibta => "ibta",
            RecoveryArg::Sr => "sr",
        }
    }
}
