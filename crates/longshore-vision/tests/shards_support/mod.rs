//! What the image-shard tests share: a tiny synthetic folder packed into several WebDataset
//! shards, and those shards opened as one dataset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use longshore_shards::dataset::ShardedDataset;
use longshore_shards::webdataset::pack_image_folder;
use longshore_vision::synth::{FolderSpec, write_folder};

/// A tiny folder (4 classes x 3 images) under `root/folder`, packed in torchvision's order into
/// several shards under `root/shards`: the folder and the number of shards.
pub(crate) fn pack_tiny_folder(root: &Path) -> (PathBuf, usize) {
    let folder = root.join("folder");
    write_folder(&folder, &FolderSpec::tiny()).unwrap();
    let index = pack_image_folder(&folder, root.join("shards"), 16 << 10, None).unwrap();
    (folder, index.shardlist.len())
}

/// The `n` shards `shard-000000.tar...` under `root/shards` as one dataset (one rank, cached
/// under `root/cache`, shuffled with `seed`); `n > 1`, so workers split several shards.
pub(crate) fn open_shards(root: &Path, n: usize, seed: u64) -> ShardedDataset {
    assert!(n > 1, "several shards");
    ShardedDataset::webdataset([format!(
        "{}/shard-{{000000..{:06}}}.tar",
        root.join("shards").display(),
        n - 1
    )])
    .cache_dir(root.join("cache"))
    .seed(seed)
    .rank(0)
    .world_size(1)
    .build()
    .unwrap()
}
