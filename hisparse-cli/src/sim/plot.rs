//! A hand-written SVG of the per-step series of a simulation: hot hit rate (top panel) and
//! host→device bytes (bottom panel). No plotting crate: two polylines, axes and labels.

use std::fmt::Write as _;

use super::report::StepStats;
use crate::size::human;

const W: f64 = 900.0;
const PANEL_H: f64 = 220.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const GAP: f64 = 80.0;

/// One panel's series (`None` = no value at that step: the line breaks).
struct Panel<'a> {
    title: &'a str,
    values: &'a [Option<f64>],
    max: f64,
    label: &'a dyn Fn(f64) -> String,
    colour: &'a str,
}

fn panel(svg: &mut String, y0: f64, p: &Panel<'_>) {
    let plot_w = W - LEFT - RIGHT;
    let n = p.values.len().max(2);
    let x = |i: usize| LEFT + plot_w * i as f64 / (n - 1) as f64;
    let max = if p.max > 0.0 { p.max } else { 1.0 };
    let y = |v: f64| y0 + PANEL_H - PANEL_H * (v / max).clamp(0.0, 1.0);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"#,
        y0 - 10.0,
        esc(p.title)
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{y0:.1}" width="{plot_w:.1}" height="{PANEL_H}" fill="none" stroke="#888"/>"##
    );
    for t in 0..=4 {
        let v = max * f64::from(t) / 4.0;
        let yy = y(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            esc(&(p.label)(v))
        );
    }
    // One polyline per run of defined values.
    let mut run: Vec<String> = Vec::new();
    let flush = |run: &mut Vec<String>, svg: &mut String| {
        if !run.is_empty() {
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>"#,
                p.colour,
                run.join(" ")
            );
            run.clear();
        }
    };
    for (i, v) in p.values.iter().enumerate() {
        match v {
            Some(v) => run.push(format!("{:.1},{:.1}", x(i), y(*v))),
            None => flush(&mut run, svg),
        }
    }
    flush(&mut run, svg);
    // Ticks at step 1 and every multiple of a round spacing, numbered.
    let spacing = tick_spacing(p.values.len());
    let ticks = std::iter::once(1).chain(
        (spacing..=p.values.len())
            .step_by(spacing)
            .filter(|&k| k > 1),
    );
    for k in ticks.take_while(|_| !p.values.is_empty()) {
        let xx = x(k - 1);
        let _ = writeln!(
            svg,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#888"/><text x="{xx:.1}" y="{:.1}" font-size="11" text-anchor="middle">{k}</text>"##,
            y0 + PANEL_H,
            y0 + PANEL_H + 4.0,
            y0 + PANEL_H + 16.0,
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">decode step of each request (1..{})</text>"#,
        LEFT + plot_w / 2.0,
        y0 + PANEL_H + 32.0,
        p.values.len()
    );
}

/// A round distance between numbered ticks (1, 2, 5, 10, 20, 50, ...) that numbers at most ten
/// of `n` steps.
fn tick_spacing(n: usize) -> usize {
    let mut unit = 1;
    loop {
        for m in [1, 2, 5] {
            if n <= 10 * m * unit {
                return m * unit;
            }
        }
        unit *= 10;
    }
}

/// The run's per-step figures by decode step: point `k - 1` is every request's `k`-th decode
/// step together (hit rate, host→device bytes), as if the requests decoded in lockstep. A step
/// of the run in which several requests decode is shared among them in equal parts; steps that
/// read nothing from host give no hit rate.
pub fn by_decode_step(steps: &[StepStats]) -> (Vec<Option<f64>>, Vec<f64>) {
    let n = steps
        .iter()
        .flat_map(|s| s.decode_steps.iter().copied())
        .max()
        .unwrap_or(0) as usize;
    let (mut hits, mut misses, mut bytes) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for s in steps {
        let share = 1.0 / s.decode_steps.len().max(1) as f64;
        for &k in &s.decode_steps {
            let i = k as usize - 1;
            hits[i] += s.hot_hits as f64 * share;
            misses[i] += s.misses as f64 * share;
            bytes[i] += s.h2d_bytes as f64 * share;
        }
    }
    let hit_rate = hits
        .iter()
        .zip(&misses)
        .map(|(&h, &m)| (h + m > 0.0).then(|| h / (h + m)))
        .collect();
    (hit_rate, bytes)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders the SVG for per-step hit rates (0..=1; `None` where a step read nothing from host)
/// and host→device bytes.
pub fn render(title: &str, hit_rate: &[Option<f64>], h2d_bytes: &[f64]) -> String {
    let h = TOP + 2.0 * PANEL_H + GAP + 50.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="20" font-size="15" text-anchor="middle">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    let pct = |v: f64| format!("{:.0}%", v * 100.0);
    panel(
        &mut svg,
        TOP + 10.0,
        &Panel {
            title: "hot-buffer hit rate per decode step",
            values: hit_rate,
            max: 1.0,
            label: &pct,
            colour: "#1f77b4",
        },
    );
    let max_bytes = h2d_bytes.iter().copied().fold(0.0, f64::max);
    let h2d: Vec<Option<f64>> = h2d_bytes.iter().copied().map(Some).collect();
    let bytes = |v: f64| human(v as u64);
    panel(
        &mut svg,
        TOP + 10.0 + PANEL_H + GAP,
        &Panel {
            title: "host→device bytes per decode step",
            values: &h2d,
            max: max_bytes * 1.05,
            label: &bytes,
            colour: "#d62728",
        },
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_well_formed_document() {
        let svg = render(
            "a <b> & c",
            &[Some(0.5), Some(0.9), Some(0.95)],
            &[1e6, 2e5, 1e5],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        // Every opened text element is closed.
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        // A step without host reads breaks the hit-rate line in two.
        let gap = render("gap", &[Some(0.5), None, Some(0.9)], &[1.0, 2.0, 3.0]);
        assert_eq!(gap.matches("<polyline").count(), 3);
    }

    #[test]
    fn the_x_axis_counts_each_requests_decode_steps_and_is_numbered() {
        let step = |hits: u64, misses: u64, bytes: u64, at: &[u32]| StepStats {
            hot_hits: hits,
            misses,
            h2d_bytes: bytes,
            decode_steps: at.to_vec(),
            ..StepStats::default()
        };
        // Two requests of 3 decode steps, the second starting one step of the run later: 4
        // steps of the run, 3 decode steps.
        let steps = [
            step(0, 0, 0, &[1]),
            step(6, 2, 400, &[2, 1]),
            step(8, 0, 200, &[3, 2]),
            step(3, 1, 100, &[3]),
        ];
        let (hit, bytes) = by_decode_step(&steps);
        assert_eq!(hit.len(), 3);
        assert_eq!(hit[0], Some(3.0 / 4.0));
        assert_eq!(hit[1], Some(7.0 / 8.0));
        assert_eq!(hit[2], Some(7.0 / 8.0));
        assert_eq!(bytes, vec![200.0, 300.0, 200.0]);
        let svg = render("t", &hit, &bytes);
        assert!(svg.contains("decode step of each request (1..3)"), "{svg}");
        assert!(
            svg.contains(">2</text>") && svg.contains(">3</text>"),
            "{svg}"
        );
        // 48 steps: numbered every 5 (1, 5, 10, ... 45).
        assert_eq!(tick_spacing(48), 5);
        assert_eq!(tick_spacing(3), 1);
        assert_eq!(tick_spacing(200), 20);
        let svg = render("t", &[Some(0.5); 48], &[1.0; 48]);
        assert!(
            svg.contains("(1..48)") && svg.contains(">45</text>"),
            "{svg}"
        );
    }

    #[test]
    fn empty_series_do_not_panic() {
        let svg = render("empty", &[], &[]);
        assert!(svg.contains("</svg>"));
    }
}
