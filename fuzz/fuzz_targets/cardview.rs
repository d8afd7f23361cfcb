//! The card view, as every container's shim reads it: any text either fails or gives a
//! view that renders to text that parses back to the same view, and whatever it says,
//! a reader's share and charge factor stay within their bounds.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_contract::cardview::{self, CHARGE_MAX_PERMILLE, CHARGE_MIN_PERMILLE, CardView};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(view) = CardView::parse(text) else {
        return;
    };
    let rendered = view.render();
    assert_eq!(
        CardView::parse(&rendered).as_ref(),
        Ok(&view),
        "round trip of\n{rendered}"
    );
    let now = view.written_ns;
    for entry in &view.containers {
        let id = Some(entry.id.as_str());
        for (limit, ceiling) in [(10, 60), (40, 40), (100, 100), (1, 1)] {
            let allowed = cardview::allowed_percent(Some(&view), id, now, limit, ceiling);
            assert!(
                (limit..=ceiling).contains(&allowed),
                "{allowed} outside [{limit}, {ceiling}]"
            );
        }
        let charge = cardview::charge_permille(Some(&view), id, now);
        assert!((CHARGE_MIN_PERMILLE..=CHARGE_MAX_PERMILLE).contains(&charge));
    }
});
