//! An iterable dataset's epoch on the consumer's side: laid out (or resumed from a position)
//! before its streams open, and marked ended when its iterator runs out.

use std::sync::Mutex;

use longshore_data::EpochLayout;

use crate::config::LoaderConfig;
use crate::error::LoaderError;
use crate::fetch::Fetch;
use crate::shared::stream_layout;
use crate::state::{Progress, StreamProgress};
use crate::sync::lock;

/// What [`begin`] made of an epoch.
pub(super) struct Begun {
    pub(super) progress: StreamProgress,
    /// Delivered batches below this position are replayed and discarded.
    pub(super) replay_until: u64,
    /// The epoch's batches (those delivered before a resume included), `u64::MAX` if unknown.
    pub(super) num_batches: u64,
}

/// Begins epoch `epoch` of the dataset behind `fetch`: from its start, from the position a
/// restore left (`restored`), or by replay up to the restored prefix when there is none. The
/// error is the epoch's first and only item.
pub(super) fn begin<F: Fetch>(
    fetch: &F,
    config: &LoaderConfig,
    epoch: u64,
    restored: Option<&Progress>,
) -> (Begun, Option<LoaderError>) {
    let layout = stream_layout(fetch, config, epoch).unwrap_or_else(|| {
        EpochLayout::new(epoch, config.seed, 1, false, config.options.num_workers)
    });
    let (base, resume, prefix) = match restored.and_then(|r| r.stream.as_ref().map(|s| (s, r))) {
        Some((s, r)) => (s.base, s.resume.clone(), r.prefix),
        None => (0, None, 0),
    };
    let (num_batches, error) = match fetch.begin_epoch(&layout, resume.as_ref()) {
        Ok(n) => (n.map_or(u64::MAX, |n| base + n), None),
        Err(e) => (u64::MAX, Some(LoaderError::Data(e))),
    };
    if base < prefix {
        tracing::debug!(target: "longshore::loader", epoch, replay = prefix - base, "the dataset has no stream position: replaying the epoch up to the checkpoint");
    }
    let begun = Begun {
        progress: StreamProgress {
            layout,
            base,
            resume,
            ended: false,
        },
        replay_until: prefix,
        num_batches,
    };
    (begun, error)
}

/// The epoch iterator `run` reached its stream's end.
pub(super) fn ended(progress: &Mutex<Progress>, run: u64) {
    let mut p = lock(progress);
    if p.owner == run
        && let Some(s) = p.stream.as_mut()
    {
        s.ended = true;
    }
}
