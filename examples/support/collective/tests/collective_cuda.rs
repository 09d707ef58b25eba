//! The NCCL backend of `collective`: a world of every visible GPU (one thread per GPU, a world
//! of 1 on a one-GPU machine) sums like the Cpu reference, in place, at an offset.
//!
//! Skips with a printed reason without a CUDA driver or without libnccl. With
//! `LONGSHORE_REQUIRE_CUDA=1` a missing driver fails, and so does a missing libnccl (with the
//! reason).

use std::time::Duration;

use longshore_collective::{CollectiveError, Communicator, Rendezvous, UniqueId, nccl_available};
use longshore_ops::ViewMut;
use longshore_transfer::{Device, TransferError};

/// The number of GPUs to use, or `None` (skip) with the reason printed.
fn gpus(test: &str) -> Option<usize> {
    longshore_testing::cuda_or_skip(test, Device::cuda(0))?;
    longshore_testing::cuda_or_skip(test, nccl_available())?;
    Some(Device::cuda_count())
}

#[test]
fn nccl_all_reduce_sums_across_every_gpu() {
    let Some(n) = gpus("nccl_all_reduce_sums_across_every_gpu") else {
        return;
    };
    eprintln!("nccl {:?}, world of {n}", nccl_available());
    let id = UniqueId::new().unwrap();
    let len = 1000usize;
    let off = 3usize; // f32 elements
    let input = |rank: usize| -> Vec<f32> {
        (0..len + off + 2)
            .map(|i| (i as f32 * 0.25) + rank as f32 * 1000.0)
            .collect()
    };
    let outs: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                s.spawn(move || {
                    let dev = Device::cuda(rank).unwrap();
                    let stream = dev.new_stream().unwrap();
                    let comm = Communicator::nccl(&stream, rank, n, &id).unwrap();
                    assert_eq!((comm.rank(), comm.world_size()), (rank, n));
                    let mut buf = stream.to_device(&input(rank)).unwrap();
                    comm.all_reduce_sum(&stream, ViewMut::new(&mut buf, off * 4), len)
                        .unwrap();
                    let out = stream.read_to_vec::<f32>(&buf).unwrap();
                    comm.check().unwrap();
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, out) in outs.iter().enumerate() {
        let mine = input(rank);
        for (i, v) in out.iter().enumerate() {
            let want = if (off..off + len).contains(&i) {
                (0..n).map(|r| input(r)[i]).sum::<f32>()
            } else {
                mine[i]
            };
            assert!(
                (v - want).abs() <= 1e-3 * want.abs().max(1.0),
                "rank {rank} index {i}: {v} vs {want}"
            );
        }
    }
}

#[test]
fn nccl_through_the_tcp_rendezvous_and_wrong_devices() {
    let Some(_) = gpus("nccl_through_the_tcp_rendezvous_and_wrong_devices") else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let rv = Rendezvous::Tcp {
        addr: "127.0.0.1".into(),
        port,
        timeout: Duration::from_secs(30),
    };
    let stream = Device::cuda(0).unwrap().new_stream().unwrap();
    let comm = Communicator::nccl_rendezvous(&stream, 0, 1, &rv).unwrap();
    let mut buf = stream.to_device(&[1.5f32, 2.5]).unwrap();
    comm.all_reduce_sum(&stream, ViewMut::from(&mut buf), 2)
        .unwrap();
    assert_eq!(stream.read_to_vec::<f32>(&buf).unwrap(), vec![1.5, 2.5]);
    // A Cpu stream or buffer is refused before anything is enqueued.
    let cpu = Device::cpu().new_stream().unwrap();
    let mut cpu_buf = cpu.to_device(&[1.0f32]).unwrap();
    assert!(matches!(
        comm.all_reduce_sum(&cpu, ViewMut::from(&mut cpu_buf), 1),
        Err(CollectiveError::Transfer(
            TransferError::DeviceMismatch { .. }
        ))
    ));
    assert!(matches!(
        comm.all_reduce_sum(&stream, ViewMut::from(&mut cpu_buf), 1),
        Err(CollectiveError::Transfer(
            TransferError::DeviceMismatch { .. }
        ))
    ));
    assert!(Communicator::nccl(&cpu, 0, 1, &UniqueId::new().unwrap()).is_err());
    comm.check().unwrap();
}

/// Two ranks over the TCP rendezvous on two GPUs, where rank 0 enqueues one all-reduce more
/// than rank 1 and then waits on its stream: without the watchdog the wait never returns.
/// `rank1_stays` keeps rank 1's communicator alive for that long (so only the timeout can end
/// rank 0's wait); otherwise rank 1 drops it at once (it left). Returns rank 0's error text
/// and how long its wait took.
fn orphaned_all_reduce(test: &str, rank1_stays: Duration) -> Option<(String, Duration)> {
    let n = gpus(test)?;
    if n < 2 {
        eprintln!("skipping {test}: needs 2 GPUs, this machine has {n}");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let rv = Rendezvous::Tcp {
        addr: "127.0.0.1".into(),
        port,
        timeout: Duration::from_secs(30),
    };
    std::thread::scope(|s| {
        let rv1 = rv.clone();
        let one = s.spawn(move || {
            let stream = Device::cuda(1).unwrap().new_stream().unwrap();
            let comm = Communicator::nccl_rendezvous(&stream, 1, 2, &rv1).unwrap();
            let mut buf = stream.to_device(&[1.0f32; 256]).unwrap();
            comm.all_reduce_sum(&stream, ViewMut::from(&mut buf), 256)
                .unwrap();
            stream.synchronize().unwrap();
            std::thread::sleep(rank1_stays);
        });
        let stream = Device::cuda(0).unwrap().new_stream().unwrap();
        let comm = Communicator::nccl_rendezvous(&stream, 0, 2, &rv).unwrap();
        comm.set_timeout(Duration::from_secs(2));
        let mut buf = stream.to_device(&[1.0f32; 256]).unwrap();
        comm.all_reduce_sum(&stream, ViewMut::from(&mut buf), 256)
            .unwrap();
        stream.synchronize().unwrap();
        // The orphan: rank 1 never joins it.
        comm.all_reduce_sum(&stream, ViewMut::from(&mut buf), 256)
            .unwrap();
        let t = std::time::Instant::now();
        // Returns once the watchdog aborted the communicator (its error, if any, is not the
        // point: the wait ends).
        let _ = stream.synchronize();
        let waited = t.elapsed();
        let err = comm.check().expect_err("the orphaned all-reduce must fail");
        one.join().unwrap();
        Some((err.to_string(), waited))
    })
}

#[test]
fn a_rank_that_leaves_mid_collective_is_named_and_nothing_hangs() {
    let Some((err, waited)) = orphaned_all_reduce(
        "a_rank_that_leaves_mid_collective_is_named_and_nothing_hangs",
        Duration::ZERO,
    ) else {
        return;
    };
    assert!(err.contains("rank 1 of 2 left"), "{err}");
    assert!(
        waited < Duration::from_secs(2),
        "named by the liveness watch, not the timeout: {waited:?}"
    );
}

#[test]
fn an_all_reduce_past_the_timeout_aborts_the_communicator() {
    let Some((err, waited)) = orphaned_all_reduce(
        "an_all_reduce_past_the_timeout_aborts_the_communicator",
        Duration::from_secs(6),
    ) else {
        return;
    };
    assert!(err.contains("has not completed"), "{err}");
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(6),
        "ended by the 2 s timeout: {waited:?}"
    );
}
