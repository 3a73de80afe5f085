//! softverbs
