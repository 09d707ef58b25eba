//! The NCCL backend of `collective`: a world of every visible GPU (one thread per GPU, a world
//! of 1 on a one-GPU machine) sums like the Cpu reference, in place, at an offset.
//!
//! Skips with a printed reason without a CUDA driver or without libnccl. With
//! `LONGSHORE_REQUIRE_CUDA=1` a missing driver fails, and so does a missing libnccl (with the
//! reason).

use std::time::Duration;

use longshore_collective::{Communicator, Rendezvous, UniqueId, nccl_available};
use longshore_ops::ViewMut;
use longshore_transfer::{Device, TransferError};

fn required() -> bool {
    std::env::var("LONGSHORE_REQUIRE_CUDA").as_deref() == Ok("1")
}

/// The number of GPUs to use, or `None` (skip) with the reason printed.
fn gpus(test: &str) -> Option<usize> {
    if let Err(e) = Device::cuda(0) {
        assert!(
            !required(),
            "LONGSHORE_REQUIRE_CUDA=1 but no CUDA device: {e}"
        );
        eprintln!("skipping {test}: {e}");
        return None;
    }
    if let Err(reason) = nccl_available() {
        assert!(
            !required(),
            "LONGSHORE_REQUIRE_CUDA=1 but NCCL is unavailable: {reason}"
        );
        eprintln!("skipping {test}: {reason}");
        return None;
    }
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
        Err(TransferError::DeviceMismatch { .. })
    ));
    assert!(matches!(
        comm.all_reduce_sum(&stream, ViewMut::from(&mut cpu_buf), 1),
        Err(TransferError::DeviceMismatch { .. })
    ));
    assert!(Communicator::nccl(&cpu, 0, 1, &UniqueId::new().unwrap()).is_err());
    comm.check().unwrap();
}
