//! Pageable uploads, direct and staged through pooled chunks by several threads (Cpu backend).

use std::sync::Arc;

use longshore_host::{HostBuffer, MemoryKind};
use longshore_transfer::{Device, Stager, StagingConfig, TransferError, UploadMode};
use rand::{Rng, SeedableRng};

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

#[test]
fn staged_upload_with_several_threads_and_odd_sizes() {
    let dev = Device::cpu();
    let stream = dev.new_stream().unwrap();
    let stager = Stager::new(
        &dev,
        StagingConfig {
            chunk_bytes: 4096,
            min_chunk_bytes: 4096,
            threads: 4,
            in_flight_per_thread: 2,
            auto_min_bytes: 1,
        },
    )
    .unwrap();
    for (i, len) in [1usize, 4095, 4096, 4097, 3 * 4096 + 7, 300_001]
        .into_iter()
        .enumerate()
    {
        let data = random(len, i as u64);
        let mut dst = stream.alloc(len + 13).unwrap();
        stream.memset(&mut dst, 0x5A).unwrap();
        let ev = stager.upload(&stream, &data, &mut dst, 13).unwrap();
        ev.synchronize().unwrap();
        let back = stream.read_to_vec::<u8>(&dst).unwrap();
        assert_eq!(&back[..13], &[0x5A; 13], "prefix clobbered at len {len}");
        assert!(back[13..] == data[..], "staged data differs at len {len}");
    }
    let stats = stager.pool().stats();
    assert!(stats.hits > 0, "chunks were never reused: {stats:?}");
}

#[test]
fn auto_direct_and_staged_modes_agree() {
    let dev = Device::cpu();
    dev.set_stager(Arc::new(
        Stager::new(
            &dev,
            StagingConfig {
                chunk_bytes: 1000,
                min_chunk_bytes: 1000,
                threads: 3,
                in_flight_per_thread: 2,
                auto_min_bytes: 5000,
            },
        )
        .unwrap(),
    ))
    .unwrap();
    let stream = dev.new_stream().unwrap();
    for mode in [UploadMode::Auto, UploadMode::Direct, UploadMode::Staged] {
        for len in [10usize, 4999, 5000, 123_457] {
            let data = random(len, len as u64);
            let mut dst = stream.alloc(len).unwrap();
            stream.upload_slice(&data, &mut dst, 0, mode).unwrap();
            assert!(
                stream.read_to_vec::<u8>(&dst).unwrap() == data,
                "{mode:?} at {len}"
            );
        }
    }
    // An owned pageable source goes through the same paths.
    let data = random(20_000, 9);
    let mut dst = stream.alloc(20_000).unwrap();
    let src = HostBuffer::from_slice(MemoryKind::Pageable, &data).unwrap();
    let src = stream.upload(src, &mut dst).unwrap().wait().unwrap();
    assert_eq!(src.as_bytes(), &data[..]);
    assert!(stream.read_to_vec::<u8>(&dst).unwrap() == data);
}

#[test]
fn stager_rejects_bad_configs_and_foreign_buffers() {
    let dev = Device::cpu();
    assert!(matches!(
        Stager::new(
            &dev,
            StagingConfig {
                threads: 0,
                ..StagingConfig::default()
            }
        ),
        Err(TransferError::Invalid(_))
    ));
    for (min, max) in [(0, 4096), (8192, 4096)] {
        let bad = Stager::new(
            &dev,
            StagingConfig {
                chunk_bytes: max,
                min_chunk_bytes: min,
                ..StagingConfig::default()
            },
        );
        assert!(
            matches!(&bad, Err(TransferError::Invalid(m)) if m.contains("min_chunk_bytes")),
            "min {min}, chunk {max}: {bad:?}"
        );
    }
    let stager = Stager::new(&dev, StagingConfig::default()).unwrap();
    let stream = dev.new_stream().unwrap();
    let mut small = stream.alloc(8).unwrap();
    assert!(matches!(
        stager.upload(&stream, &[0u8; 9], &mut small, 0),
        Err(TransferError::OutOfBounds { .. })
    ));
}

/// Threads of this process (Linux: entries of /proc/self/task).
fn thread_count() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

#[test]
fn a_stager_reserves_its_chunks_and_threads_once() {
    let dev = Device::cpu();
    let config = StagingConfig {
        chunk_bytes: 64 << 10,
        min_chunk_bytes: 64 << 10,
        threads: 4,
        in_flight_per_thread: 2,
        auto_min_bytes: 1,
    };
    let stager = Stager::new(&dev, config).unwrap();
    let made = stager.pool().stats();
    // Every chunk that can be in flight at once is allocated up front.
    assert_eq!(made.blocks_cached, 8, "{made:?}");
    assert_eq!(made.allocations, 8, "{made:?}");
    let stream = dev.new_stream().unwrap();
    let data = random(3 << 20, 77);
    let mut dst = stream.alloc(data.len()).unwrap();
    let threads_before = thread_count();
    for _ in 0..5 {
        stager
            .upload(&stream, &data, &mut dst, 0)
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(stream.read_to_vec::<u8>(&dst).unwrap() == data);
    }
    let after = stager.pool().stats();
    // 5 uploads of 48 chunks each: served from the reserved chunks (a chunk still in flight
    // when a thread wants one may cost an allocation, within the budget, never a fallback).
    assert_eq!(after.fallbacks, 0, "{after:?}");
    assert!(after.hits >= 5 * 48 - (after.allocations - 8), "{after:?}");
    assert!(after.peak_bytes_held <= 16 * (64 << 10), "{after:?}");
    // Uploads reuse the stager's threads: none is started per upload.
    if let (Some(b), Some(a)) = (threads_before, thread_count()) {
        assert!(a <= b, "threads grew from {b} to {a} over 5 uploads");
    }
}

#[test]
fn pieces_shrink_with_the_upload_and_every_lease_is_one_reserved_class() {
    let dev = Device::cpu();
    let stream = dev.new_stream().unwrap();
    let config = StagingConfig {
        chunk_bytes: 64 << 10,
        min_chunk_bytes: 1 << 10,
        threads: 3,
        in_flight_per_thread: 2,
        auto_min_bytes: 1,
    };
    let stager = Stager::new(&dev, config).unwrap();
    let reserved = stager.pool().stats().allocations;
    assert_eq!(reserved, 6);
    let mut seen = std::collections::BTreeSet::new();
    for (i, len) in [1usize, 1023, 1025, 24 * 1024 + 5, 100_000, 777_777, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let piece = stager.piece_bytes(len);
        assert!(
            (1 << 10..=64 << 10).contains(&piece) && piece.is_multiple_of(1024),
            "piece {piece} for {len}"
        );
        // About PIECES_PER_THREAD pieces a thread until the pieces reach the block size.
        if piece < 64 << 10 {
            assert!(
                len.div_ceil(piece) <= 3 * StagingConfig::PIECES_PER_THREAD,
                "{len} in pieces of {piece}"
            );
        }
        seen.insert(piece);
        let data = random(len, 1000 + i as u64);
        let mut dst = stream.alloc(len + 5).unwrap();
        stream.memset(&mut dst, 0xC3).unwrap();
        stager
            .upload(&stream, &data, &mut dst, 5)
            .unwrap()
            .synchronize()
            .unwrap();
        let back = stream.read_to_vec::<u8>(&dst).unwrap();
        assert_eq!(&back[..5], &[0xC3; 5], "prefix clobbered at len {len}");
        assert!(back[5..] == data[..], "staged data differs at len {len}");
    }
    assert!(seen.len() >= 4, "piece sizes did not vary: {seen:?}");
    let s = stager.pool().stats();
    // Whatever the piece, a lease is a whole block of the one class: no other class is
    // allocated, and nothing falls back to pageable memory.
    assert_eq!(s.fallbacks, 0, "{s:?}");
    assert_eq!(s.peak_bytes_held % (64 << 10), 0, "{s:?}");
    assert!(s.peak_bytes_held <= 12 * (64 << 10), "{s:?}");
}
