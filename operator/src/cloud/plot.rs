//! The timeline plot of a cloud run, as a self-contained SVG: members by
//! capacity over simulated time (stacked), newcomers waiting or booting,
//! the iteration rate on a second axis, and the cloud's and the job's
//! events as markers.

use std::fmt::Write as _;

use super::record::Record;

const W: f64 = 960.0;
const H: f64 = 440.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 70.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 90.0;
/// Real seconds over which the iteration rate is measured: a program
/// reports its progress every so many iterations, so shorter windows are noise.
const RATE_WINDOW_S: f64 = 2.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Iteration rate (iterations per real second) between successive samples
/// that report an iteration, at the later sample's simulated time.
pub fn iteration_rate(record: &Record) -> Vec<(f64, f64)> {
    let points: Vec<(f64, f64, u64)> = record
        .samples
        .iter()
        .filter_map(|s| s.iteration.map(|i| (s.sim, s.real, i)))
        .collect();
    let mut out = Vec::new();
    let mut last: Option<(f64, f64, u64)> = None;
    for p in points {
        match last {
            Some(l) if p.2 > l.2 && p.1 - l.1 >= RATE_WINDOW_S => {
                out.push((p.0, (p.2 - l.2) as f64 / (p.1 - l.1)));
                last = Some(p);
            }
            None => last = Some(p),
            _ => {}
        }
    }
    out
}

/// The SVG document.
pub fn svg(record: &Record) -> String {
    let t_max = record.sim_seconds.max(record.samples.last().map_or(1.0, |s| s.sim)).max(1.0);
    let max_members = record
        .samples
        .iter()
        .map(|s| (s.on_demand + s.spot + s.waiting + s.booting).max(s.on_demand_pes + s.spot_pes))
        .max()
        .unwrap_or(1)
        .max(record.target)
        .max(1) as f64
        + 1.0;
    let rate = iteration_rate(record);
    let max_rate = rate.iter().map(|r| r.1).fold(0.0, f64::max).max(1.0) * 1.1;
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |t: f64| LEFT + pw * t / t_max;
    let y = |m: f64| TOP + ph * (1.0 - m / max_members);
    let yr = |r: f64| TOP + ph * (1.0 - r / max_rate);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="14">{} on {}: members by capacity (and PEs), iteration rate, events (time factor {})</text>"#,
        esc(&record.job),
        esc(&record.scenario),
        record.time_factor
    );
    // Stacked step areas: on-demand at the bottom, spot above, then waiting/booting newcomers.
    let layers: [(&str, &str, fn(&super::record::Sample) -> u32); 3] = [
        ("on-demand members", "#4c78a8", |s| s.on_demand),
        ("spot members", "#f58518", |s| s.spot),
        ("newcomers waiting or booting", "#bab0ac", |s| s.waiting + s.booting),
    ];
    let mut base: Vec<f64> = vec![0.0; record.samples.len()];
    for (name, color, value) in layers {
        let top: Vec<f64> = record
            .samples
            .iter()
            .zip(&base)
            .map(|(smp, b)| b + f64::from(value(smp)))
            .collect();
        let mut path = String::new();
        for (i, smp) in record.samples.iter().enumerate() {
            let next_t = record.samples.get(i + 1).map_or(t_max, |n| n.sim);
            let _ = write!(
                path,
                "{}{:.1},{:.1} L{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                x(smp.sim),
                y(top[i]),
                x(next_t),
                y(top[i])
            );
        }
        for (i, smp) in record.samples.iter().enumerate().rev() {
            let next_t = record.samples.get(i + 1).map_or(t_max, |n| n.sim);
            let _ = write!(path, "L{:.1},{:.1} L{:.1},{:.1} ", x(next_t), y(base[i]), x(smp.sim), y(base[i]));
        }
        if !record.samples.is_empty() {
            let _ = writeln!(s, r#"<path d="{path}Z" fill="{color}" fill-opacity="0.75" stroke="none"><title>{name}</title></path>"#);
        }
        base = top;
    }
    // Target size.
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#333" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" fill="#333">target {}</text>"##,
        LEFT + pw,
        y(f64::from(record.target)),
        y(f64::from(record.target)),
        LEFT + 4.0,
        y(f64::from(record.target)) - 4.0,
        record.target
    );
    // PEs in the view, where instance types of different PE counts make
    // them differ from the members (same axis: one unit is a member or a PE).
    if record.samples.iter().any(|s| s.on_demand_pes + s.spot_pes != s.on_demand + s.spot) {
        let mut path = String::new();
        for (i, smp) in record.samples.iter().enumerate() {
            let next_t = record.samples.get(i + 1).map_or(t_max, |n| n.sim);
            let pes = f64::from(smp.on_demand_pes + smp.spot_pes);
            let _ = write!(
                path,
                "{}{:.1},{:.1} L{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                x(smp.sim),
                y(pes),
                x(next_t),
                y(pes)
            );
        }
        let _ = writeln!(
            s,
            r##"<path d="{path}" fill="none" stroke="#e377c2" stroke-width="2" stroke-dasharray="6 3"><title>PEs of the members</title></path>"##
        );
    }
    // Iteration rate.
    if rate.len() > 1 {
        let pts: Vec<String> = rate.iter().map(|(t, r)| format!("{:.1},{:.1}", x(*t), yr(*r))).collect();
        let _ = writeln!(
            s,
            r##"<polyline points="{}" fill="none" stroke="#2ca02c" stroke-width="2"><title>iterations per real second</title></polyline>"##,
            pts.join(" ")
        );
    }
    // Events.
    for m in &record.marks {
        let (color, label) = match m.kind.as_str() {
            "recommendation" => ("#9467bd", "R"),
            "notice" => ("#d62728", "N"),
            "terminated" | "unannounced" => ("#000000", "T"),
            "committed" => ("#1f77b4", "C"),
            "failed" | "lost" => ("#8c564b", "!"),
            "noCapacity" => ("#7f7f7f", "X"),
            "checkpoint" => ("#17becf", "D"),
            "killed" => ("#000000", "K"),
            _ => continue,
        };
        let xm = x(m.sim);
        let _ = writeln!(
            s,
            r#"<line x1="{xm:.1}" x2="{xm:.1}" y1="{TOP}" y2="{:.1}" stroke="{color}" stroke-width="1" stroke-opacity="0.6"/><text x="{xm:.1}" y="{:.1}" fill="{color}" text-anchor="middle">{label}<title>{} {}: {}</title></text>"#,
            TOP + ph,
            TOP - 4.0,
            esc(&m.kind),
            esc(m.instance.as_deref().unwrap_or("")),
            esc(&m.detail)
        );
    }
    // Axes.
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{:.1}" stroke="#000"/><line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#000"/><line x1="{:.1}" x2="{:.1}" y1="{TOP}" y2="{:.1}" stroke="#2ca02c"/>"##,
        TOP + ph,
        LEFT + pw,
        TOP + ph,
        TOP + ph,
        LEFT + pw,
        LEFT + pw,
        TOP + ph
    );
    for k in 0..=max_members as u32 {
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{k}</text>"#, LEFT - 6.0, y(f64::from(k)) + 4.0);
    }
    for k in 0..=4 {
        let r = max_rate * f64::from(k) / 4.0;
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#2ca02c">{r:.0}</text>"##,
            LEFT + pw + 6.0,
            yr(r) + 4.0
        );
    }
    let step = nice_step(t_max / 8.0);
    let mut t = 0.0;
    while t <= t_max + 1e-9 {
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{t:.0}</text>"#, x(t), TOP + ph + 16.0);
        t += step;
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">simulated seconds</text><text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">members</text><text x="{:.1}" y="{:.1}" transform="rotate(90 {:.1} {:.1})" text-anchor="middle" fill="{}">iterations / real s</text>"#,
        LEFT + pw / 2.0,
        TOP + ph + 34.0,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        W - 14.0,
        TOP + ph / 2.0,
        W - 14.0,
        TOP + ph / 2.0,
        "#2ca02c"
    );
    // Legend.
    let legend = [
        ("#4c78a8", "on-demand members"),
        ("#f58518", "spot members"),
        ("#bab0ac", "newcomers waiting/booting"),
        ("#2ca02c", "iteration rate"),
        ("#9467bd", "R recommendation"),
        ("#d62728", "N notice"),
        ("#000000", "T termination"),
        ("#1f77b4", "C rescale committed"),
        ("#e377c2", "PEs of the members (dashed; mixed shapes)"),
    ];
    for (i, (color, name)) in legend.iter().enumerate() {
        let lx = LEFT + (i % 5) as f64 * 190.0;
        let ly = H - 32.0 + (i / 5) as f64 * 18.0;
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{color}"/><text x="{:.1}" y="{:.1}">{name}</text>"#,
            ly - 10.0,
            lx + 16.0,
            ly
        );
    }
    s.push_str("</svg>\n");
    s
}

fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.max(1e-9).log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|s| *s >= raw).unwrap_or(10.0 * p)
}

#[cfg(test)]
mod tests {
    use super::super::record::{Mark, Record, Sample};
    use super::*;

    #[test]
    fn the_plot_is_well_formed_and_shows_every_marked_event() {
        let mut r = Record {
            job: "j<1>".into(),
            scenario: "s".into(),
            target: 3,
            sim_seconds: 100.0,
            ..Record::default()
        };
        for k in 0..10u32 {
            r.samples.push(Sample {
                sim: f64::from(k) * 10.0,
                real: f64::from(k),
                on_demand: 1,
                spot: 2,
                on_demand_pes: 1,
                spot_pes: 2,
                waiting: u32::from(k == 4),
                waiting_pes: u32::from(k == 4),
                booting: 0,
                iteration: Some(u64::from(k) * 100),
            });
        }
        for (kind, t) in [("notice", 30.0), ("committed", 41.0), ("terminated", 90.0), ("ready", 50.0)] {
            r.marks.push(Mark {
                sim: t,
                real: t / 10.0,
                kind: kind.into(),
                instance: Some("j-2".into()),
                detail: String::new(),
            });
        }
        let svg = svg(&r);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("j&lt;1&gt;"), "names are escaped");
        assert_eq!(svg.matches("<polyline").count(), 1, "one rate line");
        assert_eq!(svg.matches("<path").count(), 3, "three stacked layers, no PE line: one PE a member");
        // Three marker lines (ready is not drawn), each labelled.
        assert_eq!(svg.matches(">N<title>").count(), 1);
        assert_eq!(svg.matches(">C<title>").count(), 1);
        assert_eq!(svg.matches(">T<title>").count(), 1);
        // Samples 1 s apart, rates over 2 s windows.
        assert_eq!(iteration_rate(&r).len(), 4);
        assert!((iteration_rate(&r)[0].1 - 100.0).abs() < 1e-9);
        // A 2-PE replacement: the PEs get a line of their own.
        r.samples[6].spot_pes = 3;
        let svg = super::svg(&r);
        assert_eq!(svg.matches("<path").count(), 4, "the layers and the PE line");
        assert!(svg.contains("<title>PEs of the members</title>"));
    }

    #[test]
    fn steps_are_round_numbers() {
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(nice_step(13.0), 20.0);
        assert_eq!(nice_step(0.3), 0.5);
    }
}
