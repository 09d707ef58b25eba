//! mlock refused by RLIMIT_MEMLOCK is a clear error, not an abort. (Its own test binary:
//! it lowers the process's limit.)

use longshore_host::{HostBuffer, HostError, MemoryKind, PinnedPool, PoolConfig};

#[test]
fn mlock_beyond_rlimit_is_a_clear_error() {
    let lim = libc::rlimit {
        rlim_cur: 64 * 1024,
        rlim_max: libc::RLIM_INFINITY,
    };
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both structs are valid for the calls.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut old), 0);
    }
    let lim = libc::rlimit {
        rlim_max: old.rlim_max,
        rlim_cur: lim.rlim_cur.min(old.rlim_max),
    };
    // SAFETY: `lim` is valid; lowering the soft limit is always permitted.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) }, 0);
    assert_eq!(
        longshore_host::sys::memlock_limit(),
        Some(lim.rlim_cur as usize)
    );

    // The default budget of a Locked pool respects the limit.
    assert!(PoolConfig::for_kind(MemoryKind::Locked).budget <= lim.rlim_cur as usize);

    match HostBuffer::locked(64 << 20) {
        Err(HostError::MlockRefused { bytes, limit, .. }) => {
            assert_eq!(bytes, 64 << 20);
            assert!(limit.contains("65536"), "{limit}");
            let msg = HostError::MlockRefused {
                bytes,
                limit,
                errno: std::io::Error::from_raw_os_error(12),
            }
            .to_string();
            assert!(msg.contains("RLIMIT_MEMLOCK"), "{msg}");
        }
        Ok(_) => eprintln!(
            "skipping assertion: this process may lock memory past RLIMIT_MEMLOCK (CAP_IPC_LOCK)"
        ),
        Err(e) => panic!("unexpected error: {e}"),
    }
    // A Locked pool whose blocks are refused returns the error from alloc.
    let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Locked).budget(1 << 30)).unwrap();
    match pool.alloc(64 << 20) {
        Err(HostError::MlockRefused { .. }) => assert_eq!(pool.stats().bytes_held, 0),
        Ok(_) => eprintln!("skipping pool assertion: mlock is not limited for this process"),
        Err(e) => panic!("unexpected error: {e}"),
    }
}
