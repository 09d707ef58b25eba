//! Brace expansion and URL parsing as properties: expansion never panics, text without
//! braces is itself, ranges keep their zero padding and count, lists keep their order, several
//! braces multiply, and every expanded URL parses to the store its scheme names.

use longshore_shards::ShardError;
use longshore_shards::url::{ShardUrl, StoreLocation, expand_braces, expand_patterns};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn expansion_never_panics(s in "[a-z0-9{},.\\\\/:-]{0,40}") {
        match expand_braces(&s) {
            Ok(urls) => prop_assert!(!urls.is_empty()),
            Err(ShardError::Pattern { position, pattern, .. }) => {
                prop_assert!(position <= s.len());
                prop_assert_eq!(pattern, s);
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn text_without_braces_is_itself(s in "[a-zA-Z0-9_./:-]{0,60}") {
        prop_assert_eq!(expand_braces(&s).unwrap(), vec![s]);
    }

    #[test]
    fn a_padded_range_counts_and_pads(a in 0u32..5000, len in 1u32..300, width in 1usize..8) {
        let b = a + len - 1;
        let w = width.max(b.to_string().len());
        let pattern = format!("s3://b/shard-{{{a:0w$}..{b:0w$}}}.tar");
        let urls = expand_braces(&pattern).unwrap();
        prop_assert_eq!(urls.len(), len as usize);
        for (k, u) in urls.iter().enumerate() {
            let n = a + k as u32;
            // Padded when either end has a leading zero, else written plainly.
            let padded = format!("{a:0w$}").starts_with('0') || format!("{b:0w$}").starts_with('0');
            let want = if padded { format!("{n:0w$}") } else { n.to_string() };
            prop_assert_eq!(u, &format!("s3://b/shard-{want}.tar"));
        }
    }

    #[test]
    fn a_descending_stepped_range(a in 0i64..1000, span in 0i64..200, step in 1i64..9) {
        let b = a - span;
        let urls = expand_braces(&format!("{{{a}..{b}..{step}}}")).unwrap();
        let want: Vec<String> = (0..=span / step).map(|k| (a - k * step).to_string()).collect();
        prop_assert_eq!(urls, want);
    }

    #[test]
    fn lists_keep_order_and_braces_multiply(
        xs in prop::collection::vec("[a-z0-9]{1,5}", 2..5),
        ys in prop::collection::vec("[a-z0-9]{1,5}", 2..5),
    ) {
        let pattern = format!("gs://b/{{{}}}/{{{}}}.tar", xs.join(","), ys.join(","));
        let urls = expand_braces(&pattern).unwrap();
        let mut want = Vec::new();
        for x in &xs {
            for y in &ys {
                want.push(format!("gs://b/{x}/{y}.tar"));
            }
        }
        prop_assert_eq!(&urls, &want);
        for u in &urls {
            let parsed = ShardUrl::parse(u).unwrap();
            prop_assert_eq!(parsed.location(), &StoreLocation::Gcs { bucket: "b".into() });
            prop_assert!(!parsed.is_prefix());
        }
    }

    #[test]
    fn escaped_text_comes_back_literally(s in "[a-z{},\\\\]{0,30}") {
        let mut escaped = String::new();
        for c in s.chars() {
            if "{},\\".contains(c) {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        prop_assert_eq!(expand_braces(&escaped).unwrap(), vec![s]);
    }
}

#[test]
fn webdataset_style_patterns() {
    let urls = expand_braces("s3://bucket/prefix/shard-{000000..000999}.tar").unwrap();
    assert_eq!(urls.len(), 1000);
    assert_eq!(urls[0], "s3://bucket/prefix/shard-000000.tar");
    assert_eq!(urls[999], "s3://bucket/prefix/shard-000999.tar");
    let urls = expand_patterns(&[
        "s3://b/train-{0..1}.tar",
        "http://[::1]:8080/extra-{a,b}.tar",
    ])
    .unwrap();
    assert_eq!(
        urls,
        [
            "s3://b/train-0.tar",
            "s3://b/train-1.tar",
            "http://[::1]:8080/extra-a.tar",
            "http://[::1]:8080/extra-b.tar"
        ]
    );
    let err = expand_braces("s3://b/x-{0..99999}{0..99999}-{0..9}").unwrap_err();
    assert!(err.to_string().contains("more than the limit"), "{err}");
}
