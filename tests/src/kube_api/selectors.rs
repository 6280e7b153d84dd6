//! Field and label selectors as the API server parses them (the subset
//! discovery uses): `a=b`, `a==b`, `a!=b`; labels also `key` and `!key`.

use serde_json::Value;

#[derive(Clone, Debug, Default)]
pub struct Filter {
    fields: Vec<(String, Op)>,
    labels: Vec<(String, Op)>,
}

#[derive(Clone, Debug)]
enum Op {
    Eq(String),
    Ne(String),
    Exists,
    Absent,
}

impl Filter {
    /// Parses both selectors; the error is the message of a 400 Status.
    pub fn parse(fields: Option<&str>, labels: Option<&str>) -> Result<Filter, String> {
        let mut f = Filter::default();
        for term in fields
            .into_iter()
            .flat_map(|s| s.split(','))
            .filter(|t| !t.is_empty())
        {
            let (k, op) =
                binary(term).ok_or_else(|| format!("invalid field selector term {term:?}"))?;
            if !matches!(
                k.as_str(),
                "metadata.name" | "metadata.namespace" | "spec.nodeName" | "status.phase"
            ) {
                return Err(format!("field label not supported: {k}"));
            }
            f.fields.push((k, op));
        }
        for term in labels
            .into_iter()
            .flat_map(|s| s.split(','))
            .filter(|t| !t.is_empty())
        {
            if term.contains(" in ") || term.contains(" notin ") || term.contains('(') {
                return Err(format!(
                    "set-based label selector {term:?} not supported here"
                ));
            }
            let parsed = match binary(term) {
                Some(b) => b,
                None => match term.strip_prefix('!') {
                    Some(k) => (k.trim().to_owned(), Op::Absent),
                    None => (term.trim().to_owned(), Op::Exists),
                },
            };
            f.labels.push(parsed);
        }
        Ok(f)
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let field_ok = self.fields.iter().all(|(path, op)| {
            let v = path
                .split('.')
                .try_fold(obj, |v, seg| v.get(seg))
                .and_then(Value::as_str)
                .unwrap_or("");
            op.holds(Some(v))
        });
        let labels = &obj["metadata"]["labels"];
        field_ok
            && self
                .labels
                .iter()
                .all(|(k, op)| op.holds(labels.get(k).and_then(Value::as_str)))
    }
}

impl Op {
    fn holds(&self, v: Option<&str>) -> bool {
        match self {
            Op::Eq(want) => v == Some(want.as_str()),
            Op::Ne(want) => v != Some(want.as_str()),
            Op::Exists => v.is_some(),
            Op::Absent => v.is_none(),
        }
    }
}

fn binary(term: &str) -> Option<(String, Op)> {
    if let Some((k, v)) = term.split_once("!=") {
        return Some((k.trim().to_owned(), Op::Ne(v.trim().to_owned())));
    }
    let (k, v) = term.split_once("==").or_else(|| term.split_once('='))?;
    Some((k.trim().to_owned(), Op::Eq(v.trim().to_owned())))
}
