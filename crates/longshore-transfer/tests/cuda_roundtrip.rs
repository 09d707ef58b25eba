//! Round trips of random data through a GPU: every source kind and path, 1 byte to 256 MiB,
//! with poisoned outputs checked whole. Skips without a driver unless LONGSHORE_REQUIRE_CUDA=1.

mod common;

use common::gpu;
use longshore_data::seed::{GAMMA, SplitMix64};
use longshore_host::{HostBuffer, MemoryKind};
use longshore_transfer::{Stream, UploadMode};

const SIZES: [usize; 6] = [1, 4095, 4096, (1 << 20) + 7, 16 << 20, 256 << 20];

/// Fast deterministic bytes (longshore-data's SplitMix64), so 256 MiB fills quickly even in
/// debug builds.
fn fill_random(out: &mut [u8], seed: u64) {
    SplitMix64::new(seed.wrapping_mul(GAMMA) | 1).fill_bytes(out);
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if got != want {
        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        panic!(
            "{what}: first difference at byte {i} of {} ({:#04x} != {:#04x})",
            want.len(),
            got[i],
            want[i]
        );
    }
}

fn download_check(
    stream: &Stream,
    dev_buf: &longshore_transfer::DeviceBuffer,
    want: &[u8],
    kind: MemoryKind,
    what: &str,
) {
    let mut out = HostBuffer::alloc(kind, want.len()).unwrap();
    out.as_bytes_mut().fill(0x5A); // poison
    let out = stream.download(dev_buf, out).unwrap().wait().unwrap();
    assert_same(
        out.as_bytes(),
        want,
        &format!("{what}, downloaded into {kind}"),
    );
}

#[test]
fn round_trips_every_kind_and_size() {
    let Some(dev) = gpu() else { return };
    let stream = dev.new_stream().unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        let mut data = vec![0u8; len];
        fill_random(&mut data, i as u64 + 1);
        for kind in [
            MemoryKind::PageLocked,
            MemoryKind::Registered,
            MemoryKind::Pageable,
        ] {
            let mut dst = stream.alloc(len).unwrap();
            stream.memset(&mut dst, 0xA5).unwrap(); // poison the device side
            let src = HostBuffer::from_slice(kind, &data).unwrap();
            assert_eq!(src.kind(), kind);
            let upload = stream.upload(src, &mut dst).unwrap();
            let what = format!("{len} bytes from {kind}");
            // Page-locked and pageable destinations, each checked whole.
            download_check(&stream, &dst, &data, MemoryKind::PageLocked, &what);
            download_check(&stream, &dst, &data, MemoryKind::Pageable, &what);
            let src = upload.wait().unwrap();
            assert_same(
                src.as_bytes(),
                &data,
                &format!("{what}: source after the copy"),
            );
        }
    }
}

#[test]
fn pageable_direct_and_staged_paths() {
    let Some(dev) = gpu() else { return };
    let stream = dev.new_stream().unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        let mut data = vec![0u8; len];
        fill_random(&mut data, 100 + i as u64);
        for mode in [UploadMode::Direct, UploadMode::Staged, UploadMode::Auto] {
            let mut dst = stream.alloc(len + 3).unwrap();
            stream.memset(&mut dst, 0xA5).unwrap();
            let mut src = data.clone();
            stream.upload_slice(&src, &mut dst, 3, mode).unwrap();
            // The source is consumed when upload_slice returns: scribbling on it now, before
            // anything waits for the stream, must not reach the device.
            src.fill(0);
            drop(src);
            let mut out = HostBuffer::page_locked(len + 3).unwrap();
            out.as_bytes_mut().fill(0x5A);
            let out = stream.download(&dst, out).unwrap().wait().unwrap();
            assert_same(
                &out.as_bytes()[..3],
                &[0xA5; 3],
                &format!("{mode:?} {len}: prefix"),
            );
            assert_same(&out.as_bytes()[3..], &data, &format!("{mode:?} {len}"));
        }
    }
    let stats = dev.stager().unwrap().pool().stats();
    eprintln!("staging pool after the test: {stats:?}");
    assert!(stats.hits > 0, "staging chunks were never reused");
}

#[test]
fn pool_leases_round_trip_and_are_reused_after_their_copies() {
    let Some(dev) = gpu() else { return };
    let pool = longshore_host::PinnedPool::new(longshore_host::PoolConfig::for_kind(
        MemoryKind::PageLocked,
    ))
    .unwrap();
    let stream = dev.new_stream().unwrap();
    let mut dst = stream.alloc(1 << 20).unwrap();
    for round in 0..20u64 {
        let mut lease = pool.alloc(1 << 20).unwrap();
        fill_random(lease.as_bytes_mut(), round);
        let want = lease.as_bytes().to_vec();
        drop(stream.upload(lease, &mut dst).unwrap()); // released to the pool after the copy
        download_check(
            &stream,
            &dst,
            &want,
            MemoryKind::PageLocked,
            &format!("lease round {round}"),
        );
    }
    assert!(pool.stats().hits > 0);
}

#[test]
fn staged_uploads_are_ordered_on_the_callers_stream() {
    let Some(dev) = gpu() else { return };
    let stream = dev.new_stream().unwrap();
    let len = (40 << 20) + 12_345; // many pieces on every lane, and a ragged last one
    let mut dst = stream.alloc(len).unwrap();
    let mut last = Vec::new();
    // No host wait between the steps: each staged upload must land after the memset and the
    // upload before it (its lanes wait for the caller's stream), and the next step after it.
    for round in 0..4u64 {
        stream.memset(&mut dst, 0x11).unwrap();
        let mut data = vec![0u8; len];
        fill_random(&mut data, 7_000 + round);
        stream
            .upload_slice(&data, &mut dst, 0, UploadMode::Staged)
            .unwrap();
        if round % 2 == 1 {
            // A direct upload of the head right behind the staged one must win over it.
            let head = vec![round as u8; 4096];
            stream
                .upload_slice(&head, &mut dst, 0, UploadMode::Direct)
                .unwrap();
            data[..4096].copy_from_slice(&head);
        }
        last = data;
    }
    let out = HostBuffer::page_locked(len).unwrap();
    let out = stream.download(&dst, out).unwrap().wait().unwrap();
    assert_same(out.as_bytes(), &last, "after 4 unsynchronised rounds");
}
