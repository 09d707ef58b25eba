//! The Cpu backend of `collective`: N ranks as N threads, each with its own Cpu-device stream.
//! Sums are exact rank-order sums with identical bits on every rank, bytes outside the region
//! are untouched, and a rank that drops, stalls or disagrees on a length makes the others fail
//! with an error naming it instead of hanging. Also the TCP and file rendezvous of NCCL's id.

use std::time::{Duration, Instant};

use longshore_collective::{CollectiveError, CpuGroup, Rendezvous, UniqueId, share_unique_id};
use longshore_ops::ViewMut;
use longshore_transfer::{Device, TransferError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Runs `f(rank, group)` on `world` threads and returns their results in rank order.
fn on_ranks<T: Send>(group: &CpuGroup, f: impl Fn(usize, &CpuGroup) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..group.world_size())
            .map(|r| {
                let f = &f;
                s.spawn(move || f(r, group))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn sums_are_exact_rank_order_sums_with_identical_bits_on_every_rank() {
    for world in 1..=4usize {
        for case in 0..4u64 {
            let mut rng = StdRng::seed_from_u64(world as u64 * 100 + case);
            let rounds = rng.random_range(1..5usize);
            // Per round: length, byte offset (a multiple of 4), slack after the region.
            let shapes: Vec<(usize, usize, usize)> = (0..rounds)
                .map(|_| {
                    (
                        rng.random_range(1..300),
                        4 * rng.random_range(0..5),
                        4 * rng.random_range(0..3),
                    )
                })
                .collect();
            // Each rank's input of each round: wide-ranging values so the order of additions
            // matters to the bits.
            let inputs: Vec<Vec<Vec<f32>>> = (0..world)
                .map(|_| {
                    shapes
                        .iter()
                        .map(|&(len, off, slack)| {
                            (0..(off + slack) / 4 + len)
                                .map(|_| {
                                    rng.random_range(-1.0f32..1.0)
                                        * 10f32.powi(rng.random_range(-3..4))
                                })
                                .collect()
                        })
                        .collect()
                })
                .collect();
            let group = CpuGroup::new(world).unwrap();
            let outputs = on_ranks(&group, |rank, group| {
                let comm = group.join(rank).unwrap();
                assert_eq!((comm.rank(), comm.world_size()), (rank, world));
                let stream = Device::cpu().new_stream().unwrap();
                let mut outs = Vec::new();
                for (round, &(len, off, _)) in shapes.iter().enumerate() {
                    let mut buf = stream.to_device(&inputs[rank][round]).unwrap();
                    comm.all_reduce_sum(&stream, ViewMut::new(&mut buf, off), len)
                        .unwrap();
                    outs.push(stream.read_to_vec::<f32>(&buf).unwrap());
                }
                comm.check().unwrap();
                outs
            });
            for (round, &(len, off, _)) in shapes.iter().enumerate() {
                let first = off / 4;
                let mut expected = inputs[0][round].clone();
                for (i, e) in expected.iter_mut().enumerate().skip(first).take(len) {
                    for input in &inputs[1..] {
                        *e += input[round][i];
                    }
                }
                for (rank, out) in outputs.iter().enumerate() {
                    let got = &out[round];
                    for (i, g) in got.iter().enumerate() {
                        let want = if (first..first + len).contains(&i) {
                            expected[i]
                        } else {
                            inputs[rank][round][i] // outside the region: untouched
                        };
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "world {world} case {case} round {round} rank {rank} index {i}"
                        );
                    }
                }
            }
        }
    }
}

fn collective_reason(e: &CollectiveError) -> String {
    match e {
        CollectiveError::Rank { reason, .. } => reason.clone(),
        other => panic!("expected a collective error, got {other}"),
    }
}

#[test]
fn a_rank_that_drops_makes_the_others_fail_naming_it() {
    let group = CpuGroup::with_timeout(3, Duration::from_secs(30)).unwrap();
    let start = Instant::now();
    let results = on_ranks(&group, |rank, group| {
        let comm = group.join(rank).unwrap();
        let stream = Device::cpu().new_stream().unwrap();
        let mut buf = stream.to_device(&[1.0f32; 8]).unwrap();
        comm.all_reduce_sum(&stream, ViewMut::from(&mut buf), 8)
            .unwrap();
        if rank == 2 {
            stream.synchronize().unwrap();
            return Ok(stream.read_to_vec::<f32>(&buf).unwrap()); // leaves after one round
        }
        comm.all_reduce_sum(&stream, ViewMut::from(&mut buf), 8)
            .unwrap();
        stream.synchronize().unwrap();
        let first_round = stream.read_to_vec::<f32>(&buf).unwrap();
        assert_eq!(
            first_round,
            vec![3.0; 8],
            "a failed round leaves the rank's own values"
        );
        let err = comm.check().unwrap_err();
        // Later calls fail at once too.
        let again = comm
            .all_reduce_sum(&stream, ViewMut::from(&mut buf), 8)
            .unwrap_err();
        assert_eq!(collective_reason(&again), collective_reason(&err));
        Err(err)
    });
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "waited for the timeout"
    );
    assert_eq!(results[2].as_ref().unwrap(), &vec![3.0; 8]);
    for r in &results[..2] {
        let reason = collective_reason(r.as_ref().unwrap_err());
        assert!(reason.contains("rank 2 left the group"), "{reason}");
    }
}

#[test]
fn a_stalled_rank_times_the_group_out_naming_it() {
    let group = CpuGroup::with_timeout(2, Duration::from_millis(300)).unwrap();
    let comms = group.communicators().unwrap();
    let stream = Device::cpu().new_stream().unwrap();
    let mut buf = stream.to_device(&[1.0f32; 4]).unwrap();
    let start = Instant::now();
    comms[0]
        .all_reduce_sum(&stream, ViewMut::from(&mut buf), 4)
        .unwrap();
    stream.synchronize().unwrap();
    assert!(start.elapsed() >= Duration::from_millis(300));
    let reason = collective_reason(&comms[0].check().unwrap_err());
    assert!(reason.contains("for rank(s) [1]"), "{reason}");
    assert_eq!(stream.read_to_vec::<f32>(&buf).unwrap(), vec![1.0; 4]);
    // Rank 1 comes late: the group is poisoned, it fails at once.
    let s1 = Device::cpu().new_stream().unwrap();
    let mut b1 = s1.to_device(&[1.0f32; 4]).unwrap();
    let late = comms[1]
        .all_reduce_sum(&s1, ViewMut::from(&mut b1), 4)
        .unwrap_err();
    assert!(collective_reason(&late).contains("for rank(s) [1]"));
}

#[test]
fn ranks_that_disagree_on_the_length_fail() {
    let group = CpuGroup::new(2).unwrap();
    let results = on_ranks(&group, |rank, group| {
        let comm = group.join(rank).unwrap();
        let stream = Device::cpu().new_stream().unwrap();
        let mut buf = stream.to_device(&[1.0f32; 8]).unwrap();
        comm.all_reduce_sum(&stream, ViewMut::from(&mut buf), 4 + rank)
            .unwrap();
        stream.synchronize().unwrap();
        comm.check()
    });
    for r in results {
        let reason = collective_reason(&r.unwrap_err());
        assert!(reason.contains("values but rank"), "{reason}");
    }
}

#[test]
fn bad_arguments_fail_before_anything_is_enqueued() {
    let group = CpuGroup::new(1).unwrap();
    let comm = group.join(0).unwrap();
    assert!(group.join(0).is_err(), "a rank joins once");
    assert!(group.join(1).is_err(), "rank outside the world");
    assert!(CpuGroup::new(0).is_err());
    let stream = Device::cpu().new_stream().unwrap();
    let mut buf = stream.to_device(&[1.0f32; 4]).unwrap();
    assert!(matches!(
        comm.all_reduce_sum(&stream, ViewMut::from(&mut buf), 5),
        Err(CollectiveError::Transfer(TransferError::OutOfBounds { .. }))
    ));
    assert!(
        comm.all_reduce_sum(&stream, ViewMut::new(&mut buf, 2), 1)
            .is_err()
    );
    assert!(
        comm.all_reduce_sum(&stream, ViewMut::from(&mut buf), 0)
            .is_err()
    );
    // A world of one: the sum is the buffer itself.
    comm.all_reduce_sum(&stream, ViewMut::new(&mut buf, 4), 3)
        .unwrap();
    assert_eq!(stream.read_to_vec::<f32>(&buf).unwrap(), vec![1.0; 4]);
    comm.check().unwrap();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn some_id(seed: u8) -> UniqueId {
    let bytes: Vec<u8> = (0..UniqueId::LEN as u8)
        .map(|i| i.wrapping_mul(seed))
        .collect();
    UniqueId::from_bytes(&bytes).unwrap()
}

#[test]
fn the_unique_id_reaches_every_rank_over_tcp_and_through_a_file() {
    assert!(UniqueId::from_bytes(&[0u8; 127]).is_err());
    let id = some_id(7);
    assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
    let dir = tempdir();
    for rv in [
        Rendezvous::torchrun("127.0.0.1", free_port() - 1, Duration::from_secs(20)).unwrap(),
        Rendezvous::File {
            path: dir.join("nccl-id"),
            timeout: Duration::from_secs(20),
        },
    ] {
        let got: Vec<UniqueId> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|rank| {
                    let rv = rv.clone();
                    s.spawn(move || {
                        // Ranks 1 and 2 start first: they must retry until rank 0 is there.
                        if rank == 0 {
                            std::thread::sleep(Duration::from_millis(300));
                        }
                        share_unique_id(rank, 3, &rv, || Ok(id)).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got, vec![id; 3], "{rv:?}");
    }
    assert!(Rendezvous::torchrun("h", u16::MAX, Duration::from_secs(1)).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_rank_zero_or_world_mismatch_is_an_error_not_a_hang() {
    let port = free_port();
    let rv = Rendezvous::Tcp {
        addr: "127.0.0.1".into(),
        port,
        timeout: Duration::from_millis(500),
    };
    let e = share_unique_id(1, 2, &rv, || Ok(some_id(3))).unwrap_err();
    assert!(
        e.to_string().contains("could not get the id from rank 0"),
        "{e}"
    );
    // Rank 0 waiting for a rank that never comes.
    let e = share_unique_id(0, 2, &rv, || Ok(some_id(3))).unwrap_err();
    assert!(e.to_string().contains("rank(s) [1] did not connect"), "{e}");
    // A file written by a rank 0 of another world size.
    let dir = tempdir();
    let file = Rendezvous::File {
        path: dir.join("id"),
        timeout: Duration::from_millis(300),
    };
    share_unique_id(0, 3, &file, || Ok(some_id(5))).unwrap();
    let e = share_unique_id(1, 2, &file, || Ok(some_id(5))).unwrap_err();
    assert!(e.to_string().contains("runs a world of 3"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "longshore-collective-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_missing_libnccl_is_an_error_naming_it_not_a_panic() {
    match longshore_collective::nccl_available() {
        Ok(version) => assert!(version > 0),
        Err(reason) => {
            assert!(reason.contains("libnccl.so.2"), "{reason}");
            // The error names the places searched, pip packages and toolkits included.
            assert!(reason.contains("searched, in order"), "{reason}");
            assert!(reason.contains("/usr/local/cuda/lib64/"), "{reason}");
            let e = UniqueId::new().unwrap_err();
            assert!(
                matches!(e, CollectiveError::Transfer(TransferError::LibraryUnavailable { library, .. }) if library.contains("NCCL")),
                "{e}"
            );
        }
    }
}

#[test]
fn scale_divides_a_summed_gradient_in_place() {
    let stream = Device::cpu().new_stream().unwrap();
    let mut buf = stream.to_device(&[2.0f32, 4.0, 6.0, 8.0]).unwrap();
    longshore_ops::scale(&stream, ViewMut::new(&mut buf, 4), 2, 0.5).unwrap();
    assert_eq!(
        stream.read_to_vec::<f32>(&buf).unwrap(),
        vec![2.0, 2.0, 3.0, 8.0]
    );
    assert!(longshore_ops::scale(&stream, ViewMut::new(&mut buf, 4), 4, 0.5).is_err());
}

#[test]
fn libnccl_is_looked_for_by_its_sonames_only_versioned_first() {
    let c = longshore_transfer::cuda_libs::search_order(&longshore_collective::NCCL);
    assert_eq!(c[0].file, std::path::Path::new("libnccl.so.2"));
    assert!(
        c.iter()
            .all(|c| c.file.ends_with("libnccl.so.2") || c.file.ends_with("libnccl.so")),
        "{c:?}"
    );
}
