//! Property tests: generated recipes round-trip through `fmt`; arbitrary and mutated input never
//! panics and every reported span lies inside the input.

use crate::common;

use common::shape;
use proptest::prelude::*;
use recipe::commands::format::{format_source, quote};
use recipe::{check_source, syntax, Diagnostic};

fn spans_ok(text: &str, diagnostics: &[Diagnostic]) -> Result<(), TestCaseError> {
    for d in diagnostics {
        for label in std::iter::once(&d.primary).chain(&d.secondary) {
            let s = label.span;
            prop_assert!(
                s.start <= s.end && s.end <= text.len(),
                "{s:?} outside 0..{} in {d:?}",
                text.len()
            );
            prop_assert!(
                text.is_char_boundary(s.start) && text.is_char_boundary(s.end),
                "{s:?} splits a char"
            );
        }
        prop_assert!(!d.message.is_empty());
    }
    Ok(())
}

/// Checking, and formatting when it parses, must hold up on any text.
fn robust(text: &str) -> Result<(), TestCaseError> {
    let checked = check_source(text);
    spans_ok(text, &checked.diagnostics)?;
    if checked.file.is_some() {
        let once = format_source(text).expect("parsed text formats");
        let twice = format_source(&once).expect("formatted text parses");
        prop_assert_eq!(&twice, &once);
        prop_assert_eq!(shape(&once), shape(text));
    } else {
        prop_assert!(checked.has_errors());
    }
    Ok(())
}

// ---- generated, syntactically valid recipes -------------------------------------------------

fn word() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_]{0,7}".prop_filter("not a boolean or target", |w| {
        !matches!(w.as_str(), "true" | "false" | "target")
    })
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        (0i64..100_000).prop_map(|n| n.to_string()),
        (1i64..1000).prop_map(|n| format!("-{n}")),
        (0u32..1000, 1u32..1000).prop_map(|(a, b)| format!("{a}.{b}")),
        (1u32..10, 1u32..12).prop_map(|(a, e)| format!("{a}e-{e}")),
        (1u32..100).prop_map(|p| format!("{p}%")),
        (
            1u32..1000,
            prop::sample::select(vec!["k", "M", "G", "Ki", "Mi"])
        )
            .prop_map(|(n, s)| format!("{n}{s}")),
        (1u32..1000).prop_map(|n| format!("1_{n:03}")),
    ]
}

fn string() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just('"'),
            Just('\\'),
            Just('\n'),
            Just('\t'),
            Just('#'),
            Just('{'),
            Just('é'),
            Just('😀'),
            prop::char::range('a', 'z'),
            Just(' '),
        ],
        0..12,
    )
    .prop_map(|cs| quote(&cs.into_iter().collect::<String>()))
}

fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        string(),
        number(),
        prop::bool::ANY.prop_map(|b| b.to_string()),
        word(),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("({})", v.join(", "))),
            prop::collection::vec(inner.clone(), 0..4)
                .prop_map(|v| format!("[{}]", v.join(",\n  "))),
            (
                word(),
                prop::collection::vec((prop::option::of(word()), inner), 0..3)
            )
                .prop_map(|(f, args)| {
                    let args: Vec<String> = args
                        .into_iter()
                        .map(|(n, v)| match n {
                            Some(n) => format!("{n}: {v}"),
                            None => v,
                        })
                        .collect();
                    format!("{f}({})", args.join(", "))
                }),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        word(),
        (word(), word()).prop_map(|(a, b)| format!("{a} {b}")),
        (word(), word()).prop_map(|(a, b)| format!("{a}.{b}")),
    ]
}

fn comment() -> impl Strategy<Value = String> {
    "[ a-z{}\"#=]{0,10}".prop_map(|t| format!("#{t}"))
}

#[derive(Debug, Clone)]
enum Entry {
    Item(String, String, Option<String>),
    Section(String, Vec<Entry>),
    Comment(String),
    Blank,
}

fn entries() -> impl Strategy<Value = Vec<Entry>> {
    let leaf = prop_oneof![
        4 => (key(), value(), prop::option::of(comment())).prop_map(|(k, v, c)| Entry::Item(k, v, c)),
        1 => comment().prop_map(Entry::Comment),
        1 => Just(Entry::Blank),
    ];
    prop::collection::vec(leaf.clone(), 0..6).prop_recursive(2, 20, 3, move |inner| {
        prop::collection::vec(
            prop_oneof![
                3 => leaf.clone(),
                1 => (key(), inner).prop_map(|(k, body)| Entry::Section(k, body)),
            ],
            0..5,
        )
    })
}

fn render_entries(entries: &[Entry], depth: usize, inline: bool) -> String {
    let pad = "  ".repeat(depth + 1);
    let items: Vec<&Entry> = entries.iter().collect();
    // A body can only be written on one line when it holds plain items without comments.
    let plain = items.iter().all(|e| matches!(e, Entry::Item(_, _, None)));
    if inline && plain && !items.is_empty() {
        let parts: Vec<String> = items
            .iter()
            .map(|e| match e {
                Entry::Item(k, v, _) => format!("{k} = {}", v.replace('\n', " ")),
                _ => unreachable!(),
            })
            .collect();
        return format!("{{ {} }}", parts.join(", "));
    }
    let mut out = String::from("{\n");
    for e in entries {
        match e {
            Entry::Item(k, v, c) => {
                out.push_str(&format!("{pad}{k}   =  {v}"));
                if let Some(c) = c {
                    out.push_str(&format!(" {c}"));
                }
                out.push('\n');
            }
            Entry::Section(k, body) => {
                out.push_str(&format!(
                    "{pad}{k} {}\n",
                    render_entries(body, depth + 1, false)
                ));
            }
            Entry::Comment(c) => out.push_str(&format!("{pad}{c}\n")),
            Entry::Blank => out.push('\n'),
        }
    }
    out.push_str(&"  ".repeat(depth));
    out.push('}');
    out
}

fn recipe_text() -> impl Strategy<Value = String> {
    let block = (
        word(),
        prop::option::of(prop_oneof![
            word(),
            string(),
            (0u8..4).prop_map(|n| n.to_string())
        ]),
        prop::option::of((entries(), prop::bool::ANY)),
        prop::option::of(comment()),
    )
        .prop_map(|(name, label, body, trailing)| {
            let mut s = name;
            if let Some(l) = label {
                s.push(' ');
                s.push_str(&l);
            }
            if let Some((entries, inline)) = body {
                s.push(' ');
                s.push_str(&render_entries(&entries, 0, inline));
            }
            if let Some(c) = trailing {
                s.push_str("  ");
                s.push_str(&c);
            }
            s
        });
    let target = prop::collection::vec((word(), string()), 1..3).prop_map(|pairs| {
        let parts: Vec<String> = pairs.into_iter().map(|(w, s)| format!("{w} {s}")).collect();
        format!("target {}", parts.join(",\n  "))
    });
    prop::collection::vec(
        prop_oneof![6 => block, 1 => target, 1 => comment(), 1 => Just(String::new())],
        0..8,
    )
    .prop_map(|lines| lines.join("\n") + "\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn generated_recipes_parse_and_round_trip(text in recipe_text()) {
        let parsed = syntax::parse(&text);
        prop_assert!(parsed.is_ok(), "generated text should parse:\n{}\n{:?}", text, parsed.err());
        robust(&text)?;
        // Every comment survives formatting.
        let formatted = format_source(&text).unwrap();
        let before = syntax::parse(&text).unwrap().comments.len();
        let after = syntax::parse(&formatted).unwrap().comments.len();
        prop_assert_eq!(before, after, "comments lost:\n{}\n---\n{}", text, formatted);
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        robust(&text)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let text = String::from_utf8_lossy(&bytes);
        robust(&text)?;
    }

    #[test]
    fn grammar_characters_never_panic(text in "[a-z0-9 \n{}()\\[\\]=,.:#\"\\\\%-]{0,120}") {
        robust(&text)?;
    }

    #[test]
    fn mutated_examples_never_panic(
        which in 0usize..6,
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..4, "[{}()\\[\\]=,.:#\"\\\\% a-z0-9\n]{1,3}"), 1..6),
    ) {
        // Recipes only: a run of the main job leaves `recipes/out/` beside them.
        let files = common::rcp_files("recipes");
        let mut text = std::fs::read_to_string(&files[which % files.len()]).unwrap();
        for (at, op, insert) in edits {
            let mut pos = at.index(text.len() + 1);
            while !text.is_char_boundary(pos) { pos -= 1; }
            let mut end = (pos + insert.len()).min(text.len());
            while !text.is_char_boundary(end) { end -= 1; }
            match op {
                0 => text.insert_str(pos, &insert),
                1 => text.replace_range(pos..end, ""),
                2 => text.replace_range(pos..end, &insert),
                _ => { let dup = text[pos..end].to_string(); text.insert_str(pos, &dup); }
            }
        }
        robust(&text)?;
    }
}
