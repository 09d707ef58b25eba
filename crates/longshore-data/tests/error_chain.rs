//! Errors print each cause once when their chain is walked (`anyhow`'s `{:#}`), and user
//! code keeps its causes: `?` on an `std::io::Error`, or `DataError::custom`.

use std::error::Error;

use longshore_data::{DataError, Dataset, DatasetExt, NpyArray, VecDataset};

/// The messages of `err` and of every cause under it, as a chain-walking report prints them.
fn chain(err: &(dyn Error + 'static)) -> Vec<String> {
    let mut out = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push(e.to_string());
        cur = e.source();
    }
    out
}

/// Asserts that no message of the chain repeats the message of the cause under it.
fn assert_each_cause_once(err: &(dyn Error + 'static)) -> Vec<String> {
    let c = chain(err);
    for pair in c.windows(2) {
        assert!(
            !pair[0].contains(&pair[1]),
            "{:?} repeats its cause {:?}; the report would print it twice: {}",
            pair[0],
            pair[1],
            c.join(": ")
        );
    }
    c
}

#[test]
fn file_errors_name_the_file_and_leave_the_cause_to_source() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.npy");
    let err = NpyArray::open(&missing).unwrap_err();
    assert!(matches!(err, DataError::Io { .. }));
    let c = assert_each_cause_once(&err);
    assert_eq!(c.len(), 2, "{c:?}");
    assert!(c[0].contains("missing.npy"), "{c:?}");
    let io = err
        .source()
        .unwrap()
        .downcast_ref::<std::io::Error>()
        .unwrap();
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);

    let bad = dir.path().join("bad.npy");
    std::fs::write(&bad, b"not numpy at all").unwrap();
    let err = NpyArray::open(&bad).unwrap_err();
    assert!(matches!(err, DataError::Npy { .. }));
    let c = assert_each_cause_once(&err);
    assert_eq!(c.len(), 2, "{c:?}");
    assert!(c[0].contains("bad.npy") && c[1].contains("magic"), "{c:?}");
}

fn read_label(text: &str) -> Result<i64, DataError> {
    let n: i64 = text
        .trim()
        .parse()
        .map_err(|e| DataError::custom(format!("parsing label {text:?}"), e))?;
    Ok(n)
}

fn read_file(path: &std::path::Path) -> Result<String, DataError> {
    Ok(std::fs::read_to_string(path)?)
}

#[test]
fn user_errors_keep_their_causes() {
    let err = read_label("x1").unwrap_err();
    let c = assert_each_cause_once(&err);
    assert_eq!(c, ["parsing label \"x1\"", "invalid digit found in string"]);
    assert!(err.source().unwrap().is::<std::num::ParseIntError>());

    let dir = tempfile::tempdir().unwrap();
    let err = read_file(&dir.path().join("nope.txt")).unwrap_err();
    assert!(matches!(&err, DataError::UnnamedIo(e) if e.kind() == std::io::ErrorKind::NotFound));
    let c = assert_each_cause_once(&err);
    assert_eq!(c.len(), 2, "{c:?}");
    assert!(err.source().unwrap().is::<std::io::Error>());

    // Through a dataset, the cause still reaches the caller.
    let ds = VecDataset::new(vec!["1", "oops"]).try_map(read_label);
    assert_eq!(ds.get(0).unwrap(), 1);
    let err = ds.get(1).unwrap_err();
    assert_eq!(chain(&err).last().unwrap(), "invalid digit found in string");
}
