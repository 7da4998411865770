//! A Helm renderer for the offline chart tests, with no `helm` binary:
//! exactly the Go-template and Sprig features `charts/ductile` uses, and
//! an error for anything else (an unknown function, keyword, variable or
//! value key), so that a template the renderer does not understand fails
//! the test instead of rendering silently wrong.
//!
//! Supported: text with `{{ }}` actions and the `{{-`/`-}}` trim markers;
//! comments; `if`/`else if`/`else`, `with`/`else`, `range`/`else` (lists
//! and maps), `define`, `end`; pipelines with `|` and parenthesised
//! sub-pipelines; string, number, `true`/`false`/`nil` literals; `.` and
//! `.A.B` fields, `$` and `$.A.B`; `.Files.Get`; the functions `include`,
//! `toYaml`, `nindent`, `indent`, `quote`, `default`, `trunc`,
//! `trimSuffix`, `printf`, `contains`, `join`, `not`, `and`, `or`, `eq`,
//! `ne`, `lt`, `le`, `gt`, `ge`, `int`. Not supported, and refused:
//! variable declarations (`$x :=`), `template`/`block`/`break`/`continue`,
//! every other function (`tpl`, `lookup`, `required`, ...), `.Capabilities`.
//!
//! Stricter than Helm on purpose: a value key that does not exist is an
//! error (Helm renders it empty, so a typo such as `.Values.metrics.enbled`
//! would switch a feature off without a word); printing a map or a list,
//! or a number Helm would print in exponent form (values are float64 in
//! Helm: `1000000` renders `1e+06`), is an error too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// Why a chart could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct HelmError {
    /// The chart file (or `-` for none).
    pub file: String,
    /// What went wrong.
    pub message: String,
}

type Result<T> = std::result::Result<T, HelmError>;

fn fail<T>(file: &str, message: impl Into<String>) -> Result<T> {
    Err(HelmError {
        file: file.to_owned(),
        message: message.into(),
    })
}

/// The release a chart is rendered for (`.Release`).
#[derive(Clone, Debug)]
pub struct Release {
    /// `.Release.Name`.
    pub name: String,
    /// `.Release.Namespace`.
    pub namespace: String,
}

// ---------------------------------------------------------------- lexing

/// A piece of a template file: text, or one action's body (trim markers
/// and braces removed) with its line.
#[derive(Debug)]
enum Piece {
    Text(String),
    Action { body: String, line: usize },
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// Splits a template into text and actions, applying the trim markers and
/// dropping comments.
fn lex(file: &str, src: &str) -> Result<Vec<Piece>> {
    let mut pieces = Vec::new();
    let mut rest = src;
    let mut line = 1;
    let mut trim_next = false;
    while let Some(open) = rest.find("{{") {
        let mut text = rest[..open].to_owned();
        if trim_next {
            text = text.trim_start_matches(is_space).to_owned();
        }
        let action_line = line + rest[..open].matches('\n').count();
        let mut inner = &rest[open + 2..];
        let trim_left = inner.starts_with('-') && inner[1..].starts_with(is_space);
        if inner.starts_with('-') && !trim_left {
            return fail(
                file,
                format!("line {action_line}: `{{{{-` without a space after it"),
            );
        }
        if trim_left {
            text = text.trim_end_matches(is_space).to_owned();
            inner = &inner[1..];
        }
        pieces.push(Piece::Text(text));
        // Find the closing braces, outside strings and comments.
        let bytes = inner.as_bytes();
        let mut i = 0;
        let end = loop {
            if i >= bytes.len() {
                return fail(file, format!("line {action_line}: unclosed action"));
            }
            match bytes[i] {
                b'"' => {
                    i += 1;
                    while i < bytes.len() && bytes[i] != b'"' {
                        if bytes[i] == b'\\' {
                            i += 1;
                        }
                        if bytes.get(i).is_none_or(|b| *b == b'\n') {
                            return fail(file, format!("line {action_line}: newline in a string"));
                        }
                        i += 1;
                    }
                    i += 1;
                }
                b'`' => {
                    i += 1;
                    while i < bytes.len() && bytes[i] != b'`' {
                        i += 1;
                    }
                    i += 1;
                }
                b'/' if inner[i..].starts_with("/*") => match inner[i..].find("*/") {
                    Some(close) => i += close + 2,
                    None => return fail(file, format!("line {action_line}: unclosed comment")),
                },
                b'}' if inner[i..].starts_with("}}") => break i,
                _ => i += 1,
            }
        };
        let mut body = &inner[..end];
        trim_next = body.ends_with('-') && body[..body.len() - 1].ends_with(is_space);
        if trim_next {
            body = &body[..body.len() - 1];
        }
        let trimmed = body.trim_matches(is_space);
        if trimmed.starts_with("/*") {
            if !trimmed.ends_with("*/") {
                return fail(
                    file,
                    format!("line {action_line}: a comment must be the whole action"),
                );
            }
        } else {
            pieces.push(Piece::Action {
                body: trimmed.to_owned(),
                line: action_line,
            });
        }
        line = action_line + inner[..end + 2].matches('\n').count();
        rest = &inner[end + 2..];
    }
    let mut text = rest.to_owned();
    if trim_next {
        text = text.trim_start_matches(is_space).to_owned();
    }
    pieces.push(Piece::Text(text));
    Ok(pieces)
}

/// A token inside an action.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Str(String),
    Num(f64),
    Ident(String),
    /// `.A.B` (empty: `.` itself).
    Field(Vec<String>),
    /// `$name.A.B` (`$` alone: empty name).
    Var(String, Vec<String>),
    LParen,
    RParen,
    Pipe,
    Declare,
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn fields(chars: &[char], i: &mut usize) -> Vec<String> {
    let mut out = Vec::new();
    while *i < chars.len() && chars[*i] == '.' && chars.get(*i + 1).is_some_and(|c| is_ident(*c)) {
        *i += 1;
        let start = *i;
        while *i < chars.len() && is_ident(chars[*i]) {
            *i += 1;
        }
        out.push(chars[start..*i].iter().collect());
    }
    out
}

fn tokenize(body: &str) -> std::result::Result<Vec<Tok>, String> {
    let chars: Vec<char> = body.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if is_space(c) => i += 1,
            '(' => {
                toks.push(Tok::LParen);
                i += 1;
            }
            ')' => {
                toks.push(Tok::RParen);
                i += 1;
                // Go's `(x).Field`: not supported.
                if chars.get(i) == Some(&'.') {
                    return Err("`(...).Field` is not supported".into());
                }
            }
            '|' => {
                toks.push(Tok::Pipe);
                i += 1;
            }
            ':' if chars.get(i + 1) == Some(&'=') => {
                toks.push(Tok::Declare);
                i += 2;
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err("unterminated string".into()),
                        Some('"') => break,
                        Some('\\') => {
                            i += 1;
                            match chars.get(i) {
                                Some('n') => s.push('\n'),
                                Some('t') => s.push('\t'),
                                Some('\\') => s.push('\\'),
                                Some('"') => s.push('"'),
                                other => return Err(format!("unsupported escape \\{other:?}")),
                            }
                        }
                        Some(c) => s.push(*c),
                    }
                    i += 1;
                }
                i += 1;
                toks.push(Tok::Str(s));
            }
            '`' => {
                let start = i + 1;
                let Some(len) = chars[start..].iter().position(|c| *c == '`') else {
                    return Err("unterminated raw string".into());
                };
                toks.push(Tok::Str(chars[start..start + len].iter().collect()));
                i = start + len + 1;
            }
            '.' => {
                let path = fields(&chars, &mut i);
                if path.is_empty() {
                    i += 1;
                }
                toks.push(Tok::Field(path));
            }
            '$' => {
                i += 1;
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                toks.push(Tok::Var(name, fields(&chars, &mut i)));
            }
            c if c.is_ascii_digit()
                || (c == '-' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                let start = i;
                i += 1;
                while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                    i += 1;
                }
                let text: String = chars[start..i].iter().collect();
                let n = text
                    .parse::<f64>()
                    .map_err(|e| format!("number {text}: {e}"))?;
                toks.push(Tok::Num(n));
            }
            c if c.is_ascii_alphabetic() => {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                toks.push(Tok::Ident(chars[start..i].iter().collect()));
            }
            other => return Err(format!("unexpected character {other:?}")),
        }
    }
    Ok(toks)
}

// ---------------------------------------------------------------- parsing

#[derive(Clone, Debug)]
enum Arg {
    Lit(Value),
    Field(Vec<String>),
    Var(Vec<String>),
    Func(String),
    Sub(Pipeline),
}

#[derive(Clone, Debug)]
struct Command {
    args: Vec<Arg>,
}

#[derive(Clone, Debug)]
struct Pipeline {
    commands: Vec<Command>,
}

#[derive(Clone, Debug)]
enum Node {
    Text(String),
    Output(Pipeline),
    If(Pipeline, Vec<Node>, Vec<Node>),
    With(Pipeline, Vec<Node>, Vec<Node>),
    Range(Pipeline, Vec<Node>, Vec<Node>),
}

const FUNCTIONS: &[&str] = &[
    "include",
    "toYaml",
    "nindent",
    "indent",
    "quote",
    "default",
    "trunc",
    "trimSuffix",
    "printf",
    "contains",
    "join",
    "not",
    "and",
    "or",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "int",
];

fn parse_pipeline(
    toks: &[Tok],
    pos: &mut usize,
    nested: bool,
) -> std::result::Result<Pipeline, String> {
    let mut commands = Vec::new();
    let mut args = Vec::new();
    let mut closed = false;
    while *pos < toks.len() {
        let tok = toks[*pos].clone();
        *pos += 1;
        match tok {
            Tok::Pipe => {
                if args.is_empty() {
                    return Err("empty command in a pipeline".into());
                }
                commands.push(Command {
                    args: std::mem::take(&mut args),
                });
            }
            Tok::RParen if nested => {
                closed = true;
                break;
            }
            Tok::RParen => return Err("unbalanced `)`".into()),
            Tok::LParen => args.push(Arg::Sub(parse_pipeline(toks, pos, true)?)),
            Tok::Str(s) => args.push(Arg::Lit(Value::String(s))),
            Tok::Num(n) => args.push(Arg::Lit(number(n))),
            Tok::Field(path) => args.push(Arg::Field(path)),
            Tok::Var(name, path) if name.is_empty() => args.push(Arg::Var(path)),
            Tok::Var(name, _) => return Err(format!("variable ${name} (only `$` is supported)")),
            Tok::Declare => return Err("variable declarations (`:=`) are not supported".into()),
            Tok::Ident(word) => match word.as_str() {
                "true" => args.push(Arg::Lit(Value::Bool(true))),
                "false" => args.push(Arg::Lit(Value::Bool(false))),
                "nil" => args.push(Arg::Lit(Value::Null)),
                f if FUNCTIONS.contains(&f) => args.push(Arg::Func(word)),
                other => return Err(format!("unknown function or keyword `{other}`")),
            },
        }
    }
    if nested && !closed {
        return Err("unbalanced `(`".into());
    }
    if args.is_empty() {
        return Err("empty pipeline".into());
    }
    commands.push(Command { args });
    Ok(Pipeline { commands })
}

fn number(n: f64) -> Value {
    serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number)
}

/// One action, classified.
enum Action {
    Output(Pipeline),
    If(Pipeline),
    With(Pipeline),
    Range(Pipeline),
    Else(Option<(String, Pipeline)>),
    End,
    Define(String),
}

fn parse_action(body: &str) -> std::result::Result<Action, String> {
    let toks = tokenize(body)?;
    let pipeline = |from: usize| -> std::result::Result<Pipeline, String> {
        let mut pos = from;
        let p = parse_pipeline(&toks, &mut pos, false)?;
        if pos != toks.len() {
            return Err("trailing tokens".into());
        }
        Ok(p)
    };
    match toks.first() {
        Some(Tok::Ident(word)) => match word.as_str() {
            "if" => Ok(Action::If(pipeline(1)?)),
            "with" => Ok(Action::With(pipeline(1)?)),
            "range" => Ok(Action::Range(pipeline(1)?)),
            "end" if toks.len() == 1 => Ok(Action::End),
            "else" if toks.len() == 1 => Ok(Action::Else(None)),
            "else" => match toks.get(1) {
                Some(Tok::Ident(kw)) if kw == "if" || kw == "with" => {
                    Ok(Action::Else(Some((kw.clone(), pipeline(2)?))))
                }
                _ => Err("`else` followed by something other than `if`/`with`".into()),
            },
            "define" => match toks.as_slice() {
                [_, Tok::Str(name)] => Ok(Action::Define(name.clone())),
                _ => Err("`define` takes one string".into()),
            },
            "template" | "block" | "break" | "continue" | "end" => {
                Err(format!("the `{word}` action is not supported"))
            }
            _ => Ok(Action::Output(pipeline(0)?)),
        },
        _ => Ok(Action::Output(pipeline(0)?)),
    }
}

/// What ended a list of nodes.
enum Stop {
    Eof,
    End,
    Else(Option<(String, Pipeline)>),
}

struct Parser<'a> {
    file: &'a str,
    pieces: std::vec::IntoIter<Piece>,
    defines: &'a mut BTreeMap<String, Vec<Node>>,
    depth: usize,
}

impl Parser<'_> {
    fn list(&mut self) -> Result<(Vec<Node>, Stop)> {
        let mut nodes = Vec::new();
        while let Some(piece) = self.pieces.next() {
            let (body, line) = match piece {
                Piece::Text(t) => {
                    if !t.is_empty() {
                        nodes.push(Node::Text(t));
                    }
                    continue;
                }
                Piece::Action { body, line } => (body, line),
            };
            let at = |e: String| HelmError {
                file: self.file.to_owned(),
                message: format!("line {line}: {e}: {{{{ {body} }}}}"),
            };
            match parse_action(&body).map_err(at)? {
                Action::Output(p) => nodes.push(Node::Output(p)),
                Action::End => return Ok((nodes, Stop::End)),
                Action::Else(next) => return Ok((nodes, Stop::Else(next))),
                Action::If(p) => nodes.push(self.block("if", p).map_err(|e| self.line(e, line))?),
                Action::With(p) => {
                    nodes.push(self.block("with", p).map_err(|e| self.line(e, line))?)
                }
                Action::Range(p) => {
                    nodes.push(self.block("range", p).map_err(|e| self.line(e, line))?)
                }
                Action::Define(name) => {
                    if self.depth > 0 {
                        return fail(self.file, format!("line {line}: `define` inside a block"));
                    }
                    self.depth += 1;
                    let (body, stop) = self.list()?;
                    self.depth -= 1;
                    if !matches!(stop, Stop::End) {
                        return fail(
                            self.file,
                            format!("line {line}: define {name:?} has no `end`"),
                        );
                    }
                    if self.defines.insert(name.clone(), body).is_some() {
                        return fail(self.file, format!("line {line}: {name:?} is defined twice"));
                    }
                }
            }
        }
        Ok((nodes, Stop::Eof))
    }

    fn line(&self, e: HelmError, line: usize) -> HelmError {
        HelmError {
            file: e.file,
            message: format!("block at line {line}: {}", e.message),
        }
    }

    /// A block whose opening action was just read: its body, an optional
    /// `else` (or `else if`/`else with` chain), its `end`.
    fn block(&mut self, kind: &str, pipeline: Pipeline) -> Result<Node> {
        self.depth += 1;
        let (then, stop) = self.list()?;
        let els = match stop {
            Stop::End => Vec::new(),
            Stop::Eof => return fail(self.file, format!("`{kind}` without `end`")),
            Stop::Else(None) => {
                let (els, stop) = self.list()?;
                if !matches!(stop, Stop::End) {
                    return fail(self.file, format!("`{kind} ... else` without `end`"));
                }
                els
            }
            Stop::Else(Some((next, p))) => {
                if kind == "range" || next != kind {
                    return fail(self.file, format!("`else {next}` in a `{kind}`"));
                }
                // `else if` shares the outer block's `end`.
                self.depth -= 1;
                let nested = self.block(&next, p)?;
                self.depth += 1;
                vec![nested]
            }
        };
        self.depth -= 1;
        Ok(match kind {
            "if" => Node::If(pipeline, then, els),
            "with" => Node::With(pipeline, then, els),
            _ => Node::Range(pipeline, then, els),
        })
    }
}

fn parse(file: &str, src: &str, defines: &mut BTreeMap<String, Vec<Node>>) -> Result<Vec<Node>> {
    let pieces = lex(file, src)?;
    let mut parser = Parser {
        file,
        pieces: pieces.into_iter(),
        defines,
        depth: 0,
    };
    let (nodes, stop) = parser.list()?;
    match stop {
        Stop::Eof => Ok(nodes),
        Stop::End => fail(file, "`end` without a block"),
        Stop::Else(_) => fail(file, "`else` without a block"),
    }
}

// ---------------------------------------------------------------- values

/// Go's truth: false, 0, "", nil and empty collections are false.
fn truth(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// A value as Go's `fmt` prints it with `%v` (Helm's values are float64).
fn print(v: &Value) -> std::result::Result<String, String> {
    match v {
        Value::Null => Ok(String::new()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f.abs() < 1e6 {
                Ok(format!("{}", f as i64))
            } else if f.fract() != 0.0 && f.abs() >= 1e-4 && f.abs() < 1e6 {
                Ok(format!("{f}"))
            } else {
                Err(format!(
                    "{n} would print in Go's exponent form (1e+06); quote it in values"
                ))
            }
        }
        Value::Array(_) | Value::Object(_) => {
            Err(format!("printing a list or map ({v}); use toYaml"))
        }
    }
}

/// Go's `%q` of a string.
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn as_f64(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn compare(a: &Value, b: &Value) -> std::result::Result<std::cmp::Ordering, String> {
    match (a, b) {
        (Value::Number(_), Value::Number(_)) => as_f64(a)
            .zip(as_f64(b))
            .and_then(|(x, y)| x.partial_cmp(&y))
            .ok_or_else(|| "incomparable numbers".to_owned()),
        (Value::String(x), Value::String(y)) => Ok(x.cmp(y)),
        _ => Err(format!("cannot compare {a} with {b}")),
    }
}

/// Helm's `toYaml`: YAML without the final newline.
fn to_yaml(v: &Value) -> std::result::Result<String, String> {
    let text = serde_yaml::to_string(v).map_err(|e| e.to_string())?;
    Ok(text.trim_end_matches('\n').to_owned())
}

fn indent(n: usize, s: &str) -> String {
    let pad = " ".repeat(n);
    format!("{pad}{}", s.replace('\n', &format!("\n{pad}")))
}

fn str_arg<'v>(f: &str, v: &'v Value) -> std::result::Result<&'v str, String> {
    v.as_str()
        .ok_or_else(|| format!("{f}: expected a string, got {v}"))
}

fn int_arg(f: &str, v: &Value) -> std::result::Result<i64, String> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .map(|f| f as i64)
            .ok_or_else(|| format!("{f}: {n}")),
        Value::String(s) => s
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("{f}: {s:?} is no integer")),
        other => Err(format!("{f}: expected a number, got {other}")),
    }
}

fn printf(args: &[Value]) -> std::result::Result<String, String> {
    let Some((format, rest)) = args.split_first() else {
        return Err("printf without a format".into());
    };
    let format = str_arg("printf", format)?;
    let mut rest = rest.iter();
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let verb = chars.next().ok_or("printf: a lone % at the end")?;
        if verb == '%' {
            out.push('%');
            continue;
        }
        let arg = rest.next().ok_or("printf: fewer arguments than verbs")?;
        match verb {
            's' | 'v' => out.push_str(&print(arg)?),
            'd' => out.push_str(&int_arg("printf %d", arg)?.to_string()),
            'q' => out.push_str(&go_quote(&print(arg)?)),
            other => return Err(format!("printf: verb %{other} is not supported")),
        }
    }
    if rest.next().is_some() {
        return Err("printf: more arguments than verbs".into());
    }
    Ok(out)
}

// ---------------------------------------------------------------- the chart

/// A chart read from its directory: metadata, default values, templates.
pub struct Chart {
    dir: PathBuf,
    metadata: Value,
    /// `values.yaml`.
    pub default_values: Value,
    templates: BTreeMap<String, Vec<Node>>,
    defines: BTreeMap<String, Vec<Node>>,
}

/// What rendering produced: each template file's text (partials, whose
/// names start with `_`, produce none; `NOTES.txt` is kept apart).
#[derive(Debug)]
pub struct Rendered {
    /// `templates/NAME` to its text.
    pub files: BTreeMap<String, String>,
    /// The rendered NOTES.txt, if the chart has one.
    pub notes: Option<String>,
}

/// One rendered Kubernetes object and the template that made it.
#[derive(Clone, Debug)]
pub struct Object {
    /// `templates/NAME`.
    pub file: String,
    /// The object.
    pub value: Value,
}

impl Rendered {
    /// Every object of every manifest, in file order (documents that hold
    /// only comments dropped, as Helm does). A document that does not parse
    /// as YAML, or is not a mapping with `apiVersion`, `kind` and
    /// `metadata.name`, is an error.
    pub fn objects(&self) -> Result<Vec<Object>> {
        let mut out = Vec::new();
        for (file, text) in &self.files {
            for doc in serde_yaml::Deserializer::from_str(text) {
                let value =
                    <Value as serde::Deserialize>::deserialize(doc).map_err(|e| HelmError {
                        file: file.clone(),
                        message: format!("rendered YAML does not parse: {e}\n{text}"),
                    })?;
                if value.is_null() {
                    continue;
                }
                for key in ["apiVersion", "kind"] {
                    if !value[key].is_string() {
                        return fail(file, format!("an object without {key}: {value}"));
                    }
                }
                if !value["metadata"]["name"].is_string() {
                    return fail(file, format!("an object without metadata.name: {value}"));
                }
                out.push(Object {
                    file: file.clone(),
                    value,
                });
            }
        }
        Ok(out)
    }
}

/// Helm's coalescing of values: maps merge key by key, anything else in
/// `over` replaces what `base` has.
pub fn merge(base: &Value, over: &Value) -> Value {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            let mut out = b.clone();
            for (k, v) in o {
                let merged = match b.get(k) {
                    Some(bv) => merge(bv, v),
                    None => v.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (_, over) => over.clone(),
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| HelmError {
        file: path.display().to_string(),
        message: e.to_string(),
    })
}

fn yaml(path: &Path) -> Result<Value> {
    serde_yaml::from_str(&read(path)?).map_err(|e| HelmError {
        file: path.display().to_string(),
        message: e.to_string(),
    })
}

impl Chart {
    /// Reads `Chart.yaml`, `values.yaml` and every file of `templates/`.
    pub fn load(dir: &Path) -> Result<Chart> {
        let chart_yaml = yaml(&dir.join("Chart.yaml"))?;
        let Value::Object(fields) = chart_yaml else {
            return fail("Chart.yaml", "not a mapping");
        };
        // `.Chart` has Go's exported field names: name -> Name, apiVersion -> APIVersion.
        let mut metadata = Map::new();
        for (k, v) in fields {
            let key = match k.as_str() {
                "apiVersion" => "APIVersion".to_owned(),
                _ => {
                    let mut c = k.chars();
                    c.next()
                        .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                        .unwrap_or_default()
                }
            };
            metadata.insert(key, v);
        }
        let default_values = yaml(&dir.join("values.yaml"))?;
        let mut names: Vec<String> = std::fs::read_dir(dir.join("templates"))
            .map_err(|e| HelmError {
                file: "templates".into(),
                message: e.to_string(),
            })?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut templates = BTreeMap::new();
        let mut defines = BTreeMap::new();
        for name in names {
            let file = format!("templates/{name}");
            let src = read(&dir.join(&file))?;
            let nodes = parse(&file, &src, &mut defines)?;
            templates.insert(file, nodes);
        }
        Ok(Chart {
            dir: dir.to_owned(),
            metadata: Value::Object(metadata),
            default_values,
            templates,
            defines,
        })
    }

    /// `.Chart`: Chart.yaml with Go's field names.
    pub fn metadata(&self) -> &Value {
        &self.metadata
    }

    /// Renders every template with `values` (already merged over the
    /// defaults: see [`merge`]).
    pub fn render(&self, release: &Release, values: &Value) -> Result<Rendered> {
        let root = serde_json::json!({
            "Values": values,
            "Chart": self.metadata,
            "Release": {
                "Name": release.name,
                "Namespace": release.namespace,
                "Service": "Helm",
                "IsInstall": true,
                "IsUpgrade": false,
                "Revision": 1,
            },
        });
        let mut files = BTreeMap::new();
        let mut notes = None;
        for (file, nodes) in &self.templates {
            let name = file.trim_start_matches("templates/");
            if name.starts_with('_') {
                continue;
            }
            let mut eval = Eval {
                chart: self,
                root: &root,
                file,
                depth: 0,
            };
            let mut out = String::new();
            eval.nodes(nodes, &root, &mut out)
                .map_err(|message| HelmError {
                    file: file.clone(),
                    message,
                })?;
            if name == "NOTES.txt" {
                notes = Some(out);
            } else {
                files.insert(file.clone(), out);
            }
        }
        Ok(Rendered { files, notes })
    }
}

struct Eval<'a> {
    chart: &'a Chart,
    root: &'a Value,
    file: &'a str,
    depth: usize,
}

type EvalResult<T> = std::result::Result<T, String>;

impl Eval<'_> {
    fn nodes(&mut self, nodes: &[Node], dot: &Value, out: &mut String) -> EvalResult<()> {
        for node in nodes {
            match node {
                Node::Text(t) => out.push_str(t),
                Node::Output(p) => out.push_str(&print(&self.pipeline(p, dot)?)?),
                Node::If(p, then, els) => {
                    let branch = if truth(&self.pipeline(p, dot)?) {
                        then
                    } else {
                        els
                    };
                    self.nodes(branch, dot, out)?;
                }
                Node::With(p, then, els) => {
                    let v = self.pipeline(p, dot)?;
                    if truth(&v) {
                        self.nodes(then, &v, out)?;
                    } else {
                        self.nodes(els, dot, out)?;
                    }
                }
                Node::Range(p, body, els) => {
                    let items: Vec<Value> = match self.pipeline(p, dot)? {
                        Value::Array(a) => a,
                        // Go ranges over a map's values in key order.
                        Value::Object(o) => {
                            let mut kv: Vec<_> = o.into_iter().collect();
                            kv.sort_by(|a, b| a.0.cmp(&b.0));
                            kv.into_iter().map(|(_, v)| v).collect()
                        }
                        Value::Null => Vec::new(),
                        other => return Err(format!("range over {other}")),
                    };
                    if items.is_empty() {
                        self.nodes(els, dot, out)?;
                    }
                    for item in &items {
                        self.nodes(body, item, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn pipeline(&mut self, p: &Pipeline, dot: &Value) -> EvalResult<Value> {
        let mut piped: Option<Value> = None;
        for command in &p.commands {
            piped = Some(self.command(command, dot, piped.take())?);
        }
        piped.ok_or_else(|| "empty pipeline".to_owned())
    }

    fn lookup(&self, base: &Value, path: &[String], what: &str) -> EvalResult<Value> {
        let mut v = base;
        for (i, key) in path.iter().enumerate() {
            v = match v {
                Value::Object(o) => o.get(key).ok_or_else(|| {
                    format!(
                        "{what}.{} does not exist (a typo? Helm would render it empty)",
                        path[..=i].join(".")
                    )
                })?,
                other => {
                    return Err(format!(
                        "{what}.{}: {other} has no field {key}",
                        path[..i].join(".")
                    ))
                }
            };
        }
        Ok(v.clone())
    }

    fn arg(&mut self, arg: &Arg, dot: &Value) -> EvalResult<Value> {
        match arg {
            Arg::Lit(v) => Ok(v.clone()),
            Arg::Field(path) => self.lookup(dot, path, ""),
            Arg::Var(path) => self.lookup(self.root, path, "$"),
            Arg::Sub(p) => self.pipeline(p, dot),
            Arg::Func(f) => self.call(f, Vec::new()),
        }
    }

    fn command(
        &mut self,
        command: &Command,
        dot: &Value,
        piped: Option<Value>,
    ) -> EvalResult<Value> {
        let (first, rest) = command.args.split_first().ok_or("empty command")?;
        // `.Files.Get "path"`: Helm's one method call on the root.
        let files_get = match first {
            Arg::Field(path) if path == &["Files", "Get"] => {
                if dot != self.root {
                    return Err(".Files.Get with `.` not the root (use $.Files.Get)".into());
                }
                true
            }
            Arg::Var(path) => path == &["Files", "Get"],
            _ => false,
        };
        let mut args = Vec::new();
        for a in rest {
            args.push(self.arg(a, dot)?);
        }
        args.extend(piped.clone());
        if files_get {
            let [path] = args.as_slice() else {
                return Err(".Files.Get takes one path".into());
            };
            let path = str_arg(".Files.Get", path)?;
            let full = self.chart.dir.join(path);
            return std::fs::read_to_string(&full)
                .map(Value::String)
                .map_err(|e| format!(".Files.Get {path:?}: {e} (Helm would render it empty)"));
        }
        match first {
            Arg::Func(f) => self.call(f, args),
            _ if !args.is_empty() => Err(format!(
                "{first:?} is not a function and cannot take arguments"
            )),
            other => self.arg(other, dot),
        }
    }

    fn call(&mut self, f: &str, args: Vec<Value>) -> EvalResult<Value> {
        let s = |v: String| Ok(Value::String(v));
        let want = |n: usize| -> EvalResult<()> {
            if args.len() == n {
                Ok(())
            } else {
                Err(format!("{f} takes {n} arguments, got {}", args.len()))
            }
        };
        match f {
            "include" => {
                want(2)?;
                let name = str_arg(f, &args[0])?;
                let body = self
                    .chart
                    .defines
                    .get(name)
                    .ok_or_else(|| format!("include of {name:?}, which no template defines"))?;
                if self.depth > 100 {
                    return Err(format!("include {name:?}: recursion deeper than 100"));
                }
                self.depth += 1;
                let mut out = String::new();
                let result = self.nodes(body, &args[1], &mut out);
                self.depth -= 1;
                result.map_err(|e| format!("in {name:?}: {e}"))?;
                s(out)
            }
            "toYaml" => {
                want(1)?;
                s(to_yaml(&args[0])?)
            }
            "nindent" | "indent" => {
                want(2)?;
                let n = int_arg(f, &args[0])?;
                let n = usize::try_from(n).map_err(|_| format!("{f} {n}"))?;
                let text = indent(n, str_arg(f, &args[1])?);
                s(if f == "nindent" {
                    format!("\n{text}")
                } else {
                    text
                })
            }
            "quote" => {
                let mut parts = Vec::new();
                for a in args.iter().filter(|a| !a.is_null()) {
                    parts.push(go_quote(&print(a)?));
                }
                s(parts.join(" "))
            }
            "default" => match args.as_slice() {
                [d] => Ok(d.clone()),
                [d, given] => Ok(if truth(given) {
                    given.clone()
                } else {
                    d.clone()
                }),
                _ => Err(format!(
                    "default takes 1 or 2 arguments, got {}",
                    args.len()
                )),
            },
            "trunc" => {
                want(2)?;
                let n = int_arg(f, &args[0])?;
                let text = str_arg(f, &args[1])?;
                let len = text.chars().count() as i64;
                s(if n >= 0 {
                    text.chars().take(n as usize).collect()
                } else {
                    text.chars().skip((len + n).max(0) as usize).collect()
                })
            }
            "trimSuffix" => {
                want(2)?;
                let suffix = str_arg(f, &args[0])?;
                let text = str_arg(f, &args[1])?;
                s(text.strip_suffix(suffix).unwrap_or(text).to_owned())
            }
            "printf" => s(printf(&args)?),
            "contains" => {
                want(2)?;
                Ok(Value::Bool(
                    str_arg(f, &args[1])?.contains(str_arg(f, &args[0])?),
                ))
            }
            "join" => {
                want(2)?;
                let sep = str_arg(f, &args[0])?;
                let items = args[1]
                    .as_array()
                    .ok_or_else(|| format!("join of {}", args[1]))?;
                let parts: EvalResult<Vec<String>> = items.iter().map(print).collect();
                s(parts?.join(sep))
            }
            "not" => {
                want(1)?;
                Ok(Value::Bool(!truth(&args[0])))
            }
            "and" | "or" => {
                if args.is_empty() {
                    return Err(format!("{f} without arguments"));
                }
                let stop_on = f == "or";
                for a in &args {
                    if truth(a) == stop_on {
                        return Ok(a.clone());
                    }
                }
                Ok(args[args.len() - 1].clone())
            }
            "eq" | "ne" => {
                want(2)?;
                let same = match (&args[0], &args[1]) {
                    (Value::Number(_), Value::Number(_)) => as_f64(&args[0]) == as_f64(&args[1]),
                    (a, b) => a == b,
                };
                Ok(Value::Bool(same == (f == "eq")))
            }
            "lt" | "le" | "gt" | "ge" => {
                want(2)?;
                use std::cmp::Ordering::*;
                let ord = compare(&args[0], &args[1])?;
                Ok(Value::Bool(match f {
                    "lt" => ord == Less,
                    "le" => ord != Greater,
                    "gt" => ord == Greater,
                    _ => ord != Less,
                }))
            }
            "int" => {
                want(1)?;
                Ok(Value::from(int_arg(f, &args[0])?))
            }
            other => Err(format!("unknown function `{other}` in {}", self.file)),
        }
    }
}
