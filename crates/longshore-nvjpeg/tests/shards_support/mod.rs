//! What the shard tests share: the dataset over the shards a test wrote, a pipeline the device
//! refuses.

use std::path::Path;

use longshore_shards::dataset::ShardedDataset;
use longshore_shards::webdataset::ShardIndex;
use longshore_vision::transforms::{RandomResizedCrop, Resize};
use longshore_vision::{Compose, Output};

/// The dataset of one rank over the WebDataset shards `index` lists in `out` (more than two,
/// so that the order crosses shards), shuffled by `seed` in blocks of `block` samples, cached
/// under `dir/cache`.
pub(crate) fn dataset_over(
    out: &Path,
    index: &ShardIndex,
    seed: u64,
    block: u64,
    dir: &Path,
) -> ShardedDataset {
    let n = index.shardlist.len();
    assert!(n > 2, "{n} shards");
    let pattern = format!("{}/shard-{{000000..{:06}}}.tar", out.display(), n - 1);
    ShardedDataset::webdataset([pattern])
        .seed(seed)
        .shuffle_block(block)
        .rank(0)
        .world_size(1)
        .cache_dir(dir.join("cache"))
        .build()
        .unwrap()
}

/// A pipeline the device cannot run: two resizing steps (its kernel resamples once).
pub(crate) fn resizing_twice() -> Compose {
    Compose::new(
        vec![
            Resize::new(64).unwrap().into(),
            RandomResizedCrop::with_size(32, 32).unwrap().into(),
        ],
        Output::imagenet(),
    )
    .unwrap()
}
