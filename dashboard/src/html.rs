//! HTML by hand: escaping, the page layout, and the small pieces pages share.
//! Everything the server sends is built here from escaped text; no template
//! engine, no script fetched at run time.

use chrono::{DateTime, Utc};
use std::fmt::Write;

/// Text made safe for an element's content or a quoted attribute.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A value made safe for a URL's query string.
pub fn url_part(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// Which page the navigation marks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Overview,
    Instances,
    Keys,
}

/// A whole page: the layout around `top` (a page's forms, left alone by
/// the reload) and `main`. `refresh_ms`: how often the page's script
/// reloads `main` (0: never).
pub fn page(
    title: &str,
    nav: Nav,
    banner: Option<&str>,
    top: &str,
    main: &str,
    refresh_ms: u64,
) -> String {
    let link = |n: Nav, href: &str, label: &str| {
        format!(
            "<a href=\"{href}\"{}>{label}</a>",
            if n == nav { " class=\"on\"" } else { "" }
        )
    };
    let banner = banner
        .map(|b| format!("<p class=\"banner\" id=\"banner\">{}</p>", esc(b)))
        .unwrap_or_default();
    // The script comes last: it looks up `main`.
    let (live, script) = if refresh_ms > 0 {
        (
            "<label class=\"live\"><input type=\"checkbox\" id=\"live\" checked> live \
             <span id=\"updated\"></span></label>",
            format!(
                "<script>{}</script>",
                SCRIPT.replace("REFRESH_MS", &refresh_ms.to_string())
            ),
        )
    } else {
        ("", String::new())
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · gendurable</title><style>{CSS}</style></head><body>\
         <header><strong>gendurable</strong><nav>{}{}{}<a href=\"/metrics\">Metrics</a></nav>{live}</header>\
         {banner}<div class=\"top\">{top}</div><main id=\"main\">{main}</main>{script}</body></html>",
        link(Nav::Overview, "/", "Overview"),
        link(Nav::Instances, "/instances", "Instances"),
        link(Nav::Keys, "/keys", "Keys &amp; gates"),
        title = esc(title),
    )
}

/// Reloads `main` from the same URL every REFRESH_MS while the page is
/// visible and the box is ticked, skipping a beat while a form in it has the
/// focus (someone is typing).
const SCRIPT: &str = r#"(function(){
var box=document.getElementById('live'),main=document.getElementById('main');
function tick(){
 if(box.checked&&!document.hidden&&!main.contains(document.activeElement)){
  fetch(location.href,{headers:{'X-Fragment':'1'}}).then(function(r){
   if(r.ok){return r.text().then(function(t){main.innerHTML=t;
    document.getElementById('updated').textContent=new Date().toLocaleTimeString();});}
  }).catch(function(){});
 }
 setTimeout(tick,REFRESH_MS);
}
setTimeout(tick,REFRESH_MS);
})();"#;

const CSS: &str = r#"
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d2433;background:#f6f7f9}
header{display:flex;gap:24px;align-items:center;padding:10px 20px;background:#1d2433;color:#fff}
header nav a{color:#c9d1e3;text-decoration:none;margin-right:16px}
header nav a.on,header nav a:hover{color:#fff;border-bottom:2px solid #6ea8fe}
.live{margin-left:auto;color:#c9d1e3;font-size:12px}
.top,main{padding:0 20px;max-width:1400px}.top{padding-top:12px}main{padding-bottom:20px}
h1{font-size:20px;margin:4px 0 12px}h2{font-size:16px;margin:20px 0 8px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #e2e5ea}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{background:#f0f2f5;font-weight:600;font-size:12px;text-transform:uppercase;color:#556}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
a{color:#1f5fbf}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin-bottom:8px}
.card{background:#fff;border:1px solid #e2e5ea;border-radius:6px;padding:10px 14px;min-width:130px}
.card b{display:block;font-size:22px}.card span{color:#667;font-size:12px}
.badge{display:inline-block;padding:1px 7px;border-radius:10px;font-size:12px;background:#e8ebf0}
.s-executing{background:#dbeafe}.s-available{background:#e0f2e9}.s-scheduled{background:#fef3c7}
.s-awaiting{background:#ede9fe}.s-completed{background:#e5e7eb}.s-discarded{background:#fee2e2}
.s-cancelled{background:#f3e8d8}
.why{background:#fff8e6;border:1px solid #f3d58a;border-radius:6px;padding:8px 14px;margin:8px 0 16px}
.why li{margin:3px 0}
.warn{background:#fff1f0;border:1px solid #f5b5ae;border-radius:6px;padding:8px 14px;margin:8px 0}
.banner{margin:0;padding:8px 20px;background:#e8f3ff;border-bottom:1px solid #b6d4fe}
table#fields th{width:200px}
.actions{margin:0 0 12px}
pre{background:#fff;border:1px solid #e2e5ea;padding:8px;overflow:auto;max-height:400px;margin:4px 0}
form.inline{display:inline}
form.filter{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin-bottom:12px}
form.filter label{display:flex;flex-direction:column;font-size:12px;color:#556}
input,select,button{font:inherit;padding:4px 6px}
button{cursor:pointer;border:1px solid #b8c0cc;background:#fff;border-radius:4px}
button.danger{border-color:#e5a39b;color:#a8291b}
.muted{color:#778}.err{color:#a8291b}
.bar{display:inline-block;height:8px;background:#e2e5ea;width:120px;vertical-align:middle;border-radius:4px;overflow:hidden}
.bar i{display:block;height:8px;background:#3b82f6}
.bar.full i{background:#dc2626}
.pager{margin:10px 0;display:flex;gap:16px}
svg text{font-size:10px;fill:#667}
"#;

/// A status as a coloured badge.
pub fn badge(status: &str) -> String {
    format!("<span class=\"badge s-{s}\">{s}</span>", s = esc(status))
}

/// How long ago `then` was, from `now`: `4 s ago`, `3 min ago`, `in 2 h`.
pub fn ago(now: DateTime<Utc>, then: DateTime<Utc>) -> String {
    let s = (now - then).num_seconds();
    let (n, future) = (s.unsigned_abs(), s < 0);
    let text = if n < 60 {
        format!("{n} s")
    } else if n < 3600 {
        format!("{} min", n / 60)
    } else if n < 86_400 {
        format!("{} h", n / 3600)
    } else {
        format!("{} d", n / 86_400)
    };
    if future {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// A time with how long ago it was, the exact time in its title.
pub fn when(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    format!(
        "<span title=\"{}\">{}</span>",
        t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        ago(now, t)
    )
}

/// A number with thousands separators.
pub fn num(n: i64) -> String {
    let s = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

/// The hidden field every action form carries (see `actions::check`).
pub fn token_field(token: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"token\" value=\"{}\">",
        esc(token)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_urls() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(url_part("account:7 &x=é"), "account%3A7%20%26x%3D%C3%A9");
        assert_eq!(num(1234567), "1,234,567");
        assert_eq!(num(-12), "-12");
        assert_eq!(num(0), "0");
    }
}
