//! Opening devices: clear errors without a driver, and a working `Cpu` device everywhere.

use longshore_transfer::{Device, DeviceId, TransferError};

#[test]
fn cuda_device_reports_why_it_cannot_open() {
    match Device::cuda(0) {
        Ok(dev) => {
            assert!(longshore_host::driver_available());
            assert_eq!(dev.id(), DeviceId::Cuda(0));
            assert_eq!(
                Device::cuda(0).unwrap(),
                dev,
                "opening twice gives the same device"
            );
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                matches!(
                    e,
                    TransferError::CudaUnavailable { ordinal: 0, .. }
                        | TransferError::NoSuchDevice { ordinal: 0, .. }
                ),
                "{msg}"
            );
            assert!(msg.starts_with("cannot open cuda:0: "), "{msg}");
            if !longshore_host::driver_available() {
                let reason = longshore_host::driver_unavailable_reason().unwrap();
                assert!(
                    msg.contains(&reason),
                    "{msg} does not name the cause {reason}"
                );
                assert_eq!(Device::cuda_count(), 0);
            }
        }
    }
}

#[test]
fn absurd_ordinal_is_an_error_not_a_panic() {
    let e = Device::cuda(100_000).unwrap_err();
    assert!(
        matches!(
            e,
            TransferError::CudaUnavailable { .. } | TransferError::NoSuchDevice { .. }
        ),
        "{e}"
    );
}

#[test]
fn cpu_device_is_a_singleton_with_distinct_streams() {
    let (a, b) = (Device::cpu(), Device::cpu());
    assert_eq!(a, b);
    assert!(a.is_cpu());
    assert_eq!(a.to_string(), "cpu");
    let (s1, s2) = (a.new_stream().unwrap(), b.new_stream().unwrap());
    assert_ne!(s1.id(), s2.id());
    assert_eq!(s1.clone(), s1);
    assert_eq!(s1.device(), &a);
}
