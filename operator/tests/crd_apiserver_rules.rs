//! The CRD against the API server's own rules for CustomResourceDefinitions, so a CRD that a
//! real kube-apiserver refuses fails here first (issue 10: v1.36 refused every integer field
//! with a default, because `maximum: 9.223372036854776e+18` is no int64, and the schema tests
//! in crd.rs, which validate objects, never looked at the CRD itself).
//!
//! Ported, not invented: each check names the upstream file and function it comes from
//! (kubernetes/kubernetes master of the 1.3x releases, the version with selectableFields and
//! CEL cost limits; paths under staging/src/k8s.io/apiextensions-apiserver/pkg/ are shortened
//! to `apiextensions-apiserver/...`; kube-openapi is k8s.io/kube-openapi). Messages keep the
//! upstream wording and field paths (`field.Path` formatting: `a.b[key][0]`); the messages of
//! kube-openapi's value errors (bounds, enum, pattern) are close, not byte-exact. What is not
//! ported: CEL cost estimation, conversion webhooks, metadata coercion of defaults inside
//! `metadata` (this CRD has none), update-time ratcheting, format validation of strings;
//! regular expressions (`pattern`) are evaluated by kube-cel's `matches()` (RE2 syntax, like
//! Go's regexp), and a default's CEL rules by kube-cel, which applies nested defaults first
//! (the API server validates a default as written).

mod support;

use ferrotrain_api::crd::custom_resource_definition;
use kube::core::cel::{ErrorKind, Validator, compile_schema};
use serde_json::{Map, Value, json};
use support::repo_root;

// ---------------------------------------------------------------------------------------
// Field paths and errors as k8s.io/apimachinery/pkg/util/validation/field prints them.

#[derive(Clone, Debug)]
struct Path(String);

impl Path {
    fn root(name: &str) -> Path {
        Path(name.to_string())
    }
    fn child(&self, name: &str) -> Path {
        if self.0.is_empty() {
            Path(name.to_string())
        } else {
            Path(format!("{}.{name}", self.0))
        }
    }
    fn key(&self, key: &str) -> Path {
        Path(format!("{}[{key}]", self.0))
    }
    fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "<nil>" } else { &self.0 })
    }
}

/// A value as `field.Error` prints it: strings quoted, everything else as JSON.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

#[derive(Default, Debug)]
struct Errors(Vec<String>);

impl Errors {
    fn invalid(&mut self, path: &Path, value: &Value, detail: &str) {
        self.0
            .push(format!("{path}: Invalid value: {}: {detail}", shown(value)));
    }
    fn required(&mut self, path: &Path, detail: &str) {
        self.0.push(if detail.is_empty() {
            format!("{path}: Required value")
        } else {
            format!("{path}: Required value: {detail}")
        });
    }
    fn forbidden(&mut self, path: &Path, detail: &str) {
        self.0.push(format!("{path}: Forbidden: {detail}"));
    }
    fn not_supported(&mut self, path: &Path, value: &Value, supported: &[&str]) {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        self.0.push(format!(
            "{path}: Unsupported value: {}: supported values: {}",
            shown(value),
            list.join(", ")
        ));
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

// ---------------------------------------------------------------------------------------
// Name rules: k8s.io/apimachinery/pkg/util/validation/validation.go (IsDNS1123Subdomain,
// IsDNS1035Label).

fn is_dns1123_subdomain(s: &str) -> bool {
    fn label(l: &str) -> bool {
        !l.is_empty()
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    }
    s.len() <= 253 && s.split('.').all(label)
}

fn is_dns1035_label(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

// ---------------------------------------------------------------------------------------
// apiextensions-apiserver/pkg/apis/apiextensions/validation/validation.go:
// ValidateCustomResourceDefinition, for a create (every `require*` option true).

fn validate_custom_resource_definition(crd: &Value) -> Vec<String> {
    let mut errs = Errors::default();
    let spec = &crd["spec"];
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default();
    let group = spec["group"].as_str().unwrap_or_default();
    // ValidateCustomResourceDefinition: nameValidationFn.
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    if !is_dns1123_subdomain(name) || name != format!("{plural}.{group}") {
        errs.invalid(
            &Path::root("metadata.name"),
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        );
    }
    validate_spec(spec, &Path::root("spec"), &mut errs);
    errs.0
}

/// validation.go: validateCustomResourceDefinitionSpec, ValidateCustomResourceDefinitionNames.
fn validate_spec(spec: &Value, path: &Path, errs: &mut Errors) {
    let group = spec["group"].as_str().unwrap_or_default();
    if group.is_empty() {
        errs.required(&path.child("group"), "");
    } else if !is_dns1123_subdomain(group) {
        errs.invalid(
            &path.child("group"),
            &json!(group),
            "a lowercase RFC 1123 subdomain",
        );
    } else if group.split('.').count() < 2 {
        errs.invalid(
            &path.child("group"),
            &json!(group),
            "should be a domain with at least one dot",
        );
    }
    match spec["scope"].as_str().unwrap_or_default() {
        "" => errs.required(&path.child("scope"), ""),
        "Cluster" | "Namespaced" => {}
        other => errs.not_supported(
            &path.child("scope"),
            &json!(other),
            &["Cluster", "Namespaced"],
        ),
    }
    if spec["preserveUnknownFields"] == true {
        errs.invalid(
            &path.child("preserveUnknownFields"),
            &json!(true),
            "must be false in order to use defaults in the schema",
        );
    }

    // Names, after SetDefaults_CustomResourceDefinitionSpec (singular = lower(kind),
    // listKind = kind + "List").
    let names = &spec["names"];
    let kind = names["kind"].as_str().unwrap_or_default();
    let plural = names["plural"].as_str().unwrap_or_default();
    let singular = names["singular"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let list_kind = names["listKind"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("{kind}List"));
    let np = path.child("names");
    for (field, value) in [
        ("plural", plural),
        ("singular", singular.as_str()),
        ("kind", kind),
        ("listKind", list_kind.as_str()),
    ] {
        if value.is_empty() {
            errs.required(&np.child(field), "");
        } else if !is_dns1035_label(&value.to_lowercase())
            || (matches!(field, "plural" | "singular") && !is_dns1035_label(value))
        {
            errs.invalid(&np.child(field), &json!(value), "a DNS-1035 label");
        }
    }
    if !kind.is_empty() && kind == list_kind {
        errs.invalid(
            &np.child("listKind"),
            &json!(list_kind),
            "kind and listKind may not be the same",
        );
    }
    for list in ["shortNames", "categories"] {
        for (i, v) in names[list].as_array().into_iter().flatten().enumerate() {
            if !v.as_str().is_some_and(is_dns1035_label) {
                errs.invalid(&np.child(list).index(i), v, "a DNS-1035 label");
            }
        }
    }

    // Versions: unique names, exactly one storage version.
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    let mut storage = 0;
    for (i, v) in versions.iter().enumerate() {
        let name = v["name"].as_str().unwrap_or_default();
        if !seen.insert(name.to_string()) {
            errs.invalid(
                &path.child("versions"),
                &json!("..."),
                "must contain unique version names",
            );
        }
        if !is_dns1035_label(name) {
            errs.invalid(
                &path.child("versions").index(i).child("name"),
                &json!(name),
                "a DNS-1035 label",
            );
        }
        if v["storage"] == true {
            storage += 1;
        }
    }
    if storage != 1 {
        errs.invalid(
            &path.child("versions"),
            &json!("..."),
            "must have exactly one version marked as storage version",
        );
    }

    // The v1 -> internal conversion (apiextensions/v1/conversion.go,
    // Convert_v1_CustomResourceDefinitionSpec_To_apiextensions_CustomResourceDefinitionSpec)
    // moves a schema, subresources or columns that every version shares to the top level, so
    // that is where the API server reports them (`spec.validation.openAPIV3Schema...`).
    let shared = |key: &str| -> bool {
        !versions.is_empty()
            && versions
                .iter()
                .all(|v| v.get(key).is_some() && v[key] == versions[0][key])
    };
    for (i, v) in versions.iter().enumerate() {
        let vp = path.child("versions").index(i);
        let status_enabled = v["subresources"].get("status").is_some();
        if let Some(schema) = v["schema"].get("openAPIV3Schema") {
            let sp = if shared("schema") {
                path.child("validation")
            } else {
                vp.child("schema")
            };
            validate_validation(schema, status_enabled, &sp, errs);
        } else {
            errs.required(
                &vp.child("schema").child("openAPIV3Schema"),
                "schemas are required",
            );
        }
        if let Some(scale) = v["subresources"].get("scale") {
            let sp = if shared("subresources") {
                path.child("subresources")
            } else {
                vp.child("subresources")
            };
            validate_scale(scale, &sp, errs);
        }
        let cp = if shared("additionalPrinterColumns") {
            path.child("additionalPrinterColumns")
        } else {
            vp.child("additionalPrinterColumns")
        };
        for (j, column) in v["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            validate_column(column, &cp.index(j), errs);
        }
    }
}

/// validation.go: ValidateCustomResourceDefinitionSubresources (scale paths).
fn validate_scale(scale: &Value, path: &Path, errs: &mut Errors) {
    for (field, prefix) in [
        ("specReplicasPath", ".spec."),
        ("statusReplicasPath", ".status."),
    ] {
        let p = path.child(&format!("scale.{field}"));
        match scale[field].as_str() {
            None | Some("") => errs.required(&p, ""),
            Some(s) if !validate_simple_json_path(s, &p, errs) => {}
            Some(s) if !s.starts_with(prefix) => errs.invalid(
                &p,
                &json!(s),
                &format!(
                    "should be a json path under {}",
                    prefix.trim_end_matches('.')
                ),
            ),
            Some(_) => {}
        }
    }
}

/// validation.go: validateSimpleJSONPath. True when valid.
fn validate_simple_json_path(s: &str, path: &Path, errs: &mut Errors) -> bool {
    if s.is_empty() {
        errs.invalid(path, &json!(s), "must not be empty");
        false
    } else if !s.starts_with('.') {
        errs.invalid(
            path,
            &json!(s),
            "must be a simple json path starting with .",
        );
        false
    } else {
        true
    }
}

/// validation.go: ValidateCustomResourceColumnDefinition (printerColumnDatatypes,
/// customResourceColumnDefinitionFormats).
fn validate_column(column: &Value, path: &Path, errs: &mut Errors) {
    const TYPES: [&str; 5] = ["boolean", "date", "integer", "number", "string"];
    const FORMATS: [&str; 8] = [
        "byte",
        "date",
        "date-time",
        "double",
        "float",
        "int32",
        "int64",
        "password",
    ];
    if column["name"].as_str().unwrap_or_default().is_empty() {
        errs.required(&path.child("name"), "");
    }
    match column["type"].as_str().unwrap_or_default() {
        "" => errs.required(
            &path.child("type"),
            &format!("must be one of {}", TYPES.join(",")),
        ),
        t if !TYPES.contains(&t) => errs.invalid(
            &path.child("type"),
            &json!(t),
            &format!("must be one of {}", TYPES.join(",")),
        ),
        _ => {}
    }
    if let Some(f) = column["format"].as_str()
        && !f.is_empty()
        && !FORMATS.contains(&f)
    {
        errs.invalid(
            &path.child("format"),
            &json!(f),
            &format!("must be one of {}", FORMATS.join(",")),
        );
    }
    match column["jsonPath"].as_str().unwrap_or_default() {
        "" => errs.required(&path.child("JSONPath"), ""),
        s => {
            validate_simple_json_path(s, &path.child("JSONPath"), errs);
        }
    }
}

/// validation.go: validateCustomResourceDefinitionValidation.
fn validate_validation(schema: &Value, status_enabled: bool, path: &Path, errs: &mut Errors) {
    let sp = path.child("openAPIV3Schema");
    if status_enabled {
        // allowedFieldsAtRootSchema, in JSON spelling.
        const ALLOWED: [&str; 22] = [
            "description",
            "type",
            "format",
            "title",
            "maximum",
            "exclusiveMaximum",
            "minimum",
            "exclusiveMinimum",
            "maxLength",
            "minLength",
            "pattern",
            "maxItems",
            "minItems",
            "uniqueItems",
            "multipleOf",
            "required",
            "items",
            "properties",
            "externalDocs",
            "example",
            "x-kubernetes-preserve-unknown-fields",
            "x-kubernetes-validations",
        ];
        for key in schema.as_object().into_iter().flatten().map(|(k, _)| k) {
            if key == "type" {
                if schema["type"] != "object" {
                    errs.invalid(
                        &path.child("openAPIV3Schema.type"),
                        &schema["type"],
                        "only \"object\" is allowed as the type at the root of the schema if the status subresource is enabled",
                    );
                }
            } else if !ALLOWED.contains(&key.as_str()) {
                errs.invalid(
                    &sp,
                    &json!(key),
                    "only [Description Type Format Title Maximum ExclusiveMaximum Minimum ExclusiveMinimum MaxLength MinLength Pattern MaxItems MinItems UniqueItems MultipleOf Required Items Properties ExternalDocs Example XPreserveUnknownFields XValidations] fields are allowed at the root of the schema if the status subresource is enabled",
                );
            }
        }
    }
    if schema["nullable"] == true {
        errs.forbidden(
            &path.child("openAPIV3Schema.nullable"),
            "nullable cannot be true at the root",
        );
    }

    // requireStructuralSchema: structural first, defaults only when structural.
    let mut structural = Errors::default();
    validate_structural_invariants(schema, Level::Root, &sp, &mut structural);
    validate_structural_completeness(schema, &sp, &mut structural);
    let structural_ok = structural.len() == 0;
    errs.0.extend(structural.0);
    if structural_ok {
        validate_defaults(schema, &sp, errs);
    }

    let before = errs.len();
    validate_openapi_schema(schema, &sp, &SpecStandardValidator::default(), true, errs);
    // The CEL rules compile only once the schema itself is sound (the upstream function
    // skips CEL when SchemaErrors is non-empty).
    if structural_ok && errs.len() == before {
        compile_cel_rules(schema, &sp, errs);
    }
}

// ---------------------------------------------------------------------------------------
// apiextensions-apiserver/pkg/apiserver/schema/validation.go: ValidateStructural
// (validateStructuralInvariants, validateStructuralMetadataInvariants, validateExtensions,
// validateValueValidation, validateNestedValueValidation) and complete.go
// (validateStructuralCompleteness).

#[derive(Clone, Copy, PartialEq)]
enum Level {
    Root,
    Item,
    Field,
}

fn ext(schema: &Value, name: &str) -> bool {
    schema[name] == true
}

/// The two IntOrString exceptions: `anyOf: [{type: integer}, {type: string}]`, possibly as
/// the first `allOf`.
fn is_int_or_string_any_of(any_of: &Value) -> bool {
    any_of == &json!([{"type": "integer"}, {"type": "string"}])
}

fn validate_structural_invariants(s: &Value, lvl: Level, path: &Path, errs: &mut Errors) {
    if !s.is_object() {
        return;
    }
    let ty = s["type"].as_str().unwrap_or_default();
    if ty == "array" && s.get("items").is_none() {
        errs.required(&path.child("items"), "must be specified");
    }
    if let Some(items) = s.get("items") {
        validate_structural_invariants(items, Level::Item, &path.child("items"), errs);
    }
    for (k, v) in s["properties"].as_object().into_iter().flatten() {
        validate_structural_invariants(v, Level::Field, &path.child("properties").key(k), errs);
    }
    if let Some(ap) = s.get("additionalProperties") {
        if lvl == Level::Root {
            errs.forbidden(
                &path.child("additionalProperties"),
                "must not be used at the root",
            );
        }
        if ap.is_object() {
            validate_structural_invariants(
                ap,
                Level::Field,
                &path.child("additionalProperties"),
                errs,
            );
        }
    }

    // validateExtensions.
    let int_or_string = ext(s, "x-kubernetes-int-or-string");
    let preserve = ext(s, "x-kubernetes-preserve-unknown-fields");
    let embedded = ext(s, "x-kubernetes-embedded-resource");
    if int_or_string && preserve {
        errs.invalid(
            &path.child("x-kubernetes-preserve-unknown-fields"),
            &json!(true),
            "must be false if x-kubernetes-int-or-string is true",
        );
    }
    if int_or_string && embedded {
        errs.invalid(
            &path.child("x-kubernetes-embedded-resource"),
            &json!(true),
            "must be false if x-kubernetes-int-or-string is true",
        );
    }

    // validateValueValidation: logical junctors, with the IntOrString exceptions.
    let skip_any_of = s.get("anyOf").is_some_and(is_int_or_string_any_of);
    let skip_first_all_of_any_of = s["allOf"][0]
        .get("anyOf")
        .is_some_and(is_int_or_string_any_of);
    validate_value_validation(s, skip_any_of, skip_first_all_of_any_of, lvl, path, errs);

    let check_metadata = lvl == Level::Root || embedded;
    if embedded && ty != "object" {
        if ty.is_empty() {
            errs.required(
                &path.child("type"),
                "must be object if x-kubernetes-embedded-resource is true",
            );
        } else {
            errs.invalid(
                &path.child("type"),
                &json!(ty),
                "must be object if x-kubernetes-embedded-resource is true",
            );
        }
    } else if ty.is_empty() && !int_or_string && !preserve {
        let detail = match lvl {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errs.required(&path.child("type"), detail);
    }
    if embedded && s.get("additionalProperties").is_some() {
        errs.forbidden(
            &path.child("additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        );
    }
    if lvl == Level::Root && !ty.is_empty() && ty != "object" {
        errs.invalid(
            &path.child("type"),
            &json!(ty),
            "must be object at the root",
        );
    }
    for meta in ["kind", "apiVersion"] {
        if let Some(p) = s["properties"].get(meta)
            && check_metadata
            && p["type"] != "string"
        {
            errs.invalid(
                &path.child("properties").key(meta).child("type"),
                &p["type"],
                "must be string",
            );
        }
    }
    if let Some(metadata) = s["properties"].get("metadata") {
        let mp = path.child("properties").key("metadata");
        if check_metadata && metadata["type"] != "object" {
            errs.invalid(&mp.child("type"), &metadata["type"], "must be object");
        }
        if lvl == Level::Root {
            // validateStructuralMetadataInvariants: name and generateName only.
            let mut rest = metadata.as_object().cloned().unwrap_or_default();
            rest.remove("type");
            rest.remove("default"); // checked in API validation
            if let Some(props) = rest.get("properties").and_then(Value::as_object) {
                let only_names = props.keys().all(|k| k == "name" || k == "generateName");
                if only_names && !props.is_empty() {
                    rest.remove("properties");
                }
            }
            if !rest.is_empty() {
                errs.forbidden(
                    &mp,
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                );
            }
        }
    }
    if embedded && !preserve && s["properties"].as_object().is_none_or(Map::is_empty) {
        errs.required(
            &path.child("properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        );
    }
}

fn validate_value_validation(
    v: &Value,
    skip_any_of: bool,
    skip_first_all_of_any_of: bool,
    lvl: Level,
    path: &Path,
    errs: &mut Errors,
) {
    if !skip_any_of {
        for (i, n) in v["anyOf"].as_array().into_iter().flatten().enumerate() {
            validate_nested_value_validation(n, false, lvl, &path.child("anyOf").index(i), errs);
        }
    }
    for (i, n) in v["allOf"].as_array().into_iter().flatten().enumerate() {
        let skip = skip_first_all_of_any_of && i == 0;
        validate_nested_value_validation(n, skip, lvl, &path.child("allOf").index(i), errs);
    }
    for (i, n) in v["oneOf"].as_array().into_iter().flatten().enumerate() {
        validate_nested_value_validation(n, false, lvl, &path.child("oneOf").index(i), errs);
    }
    if let Some(not) = v.get("not") {
        validate_nested_value_validation(not, false, lvl, &path.child("not"), errs);
    }
    if let Some(pattern) = v["pattern"].as_str()
        && let Err(e) = regex_matches(pattern, "")
    {
        errs.invalid(
            &path.child("pattern"),
            &json!(pattern),
            &format!("must be a valid regular expression, but isn't: {e}"),
        );
    }
}

fn validate_nested_value_validation(
    v: &Value,
    skip_any_of: bool,
    lvl: Level,
    path: &Path,
    errs: &mut Errors,
) {
    validate_value_validation(v, skip_any_of, false, lvl, path, errs);
    if let Some(items) = v.get("items") {
        validate_nested_value_validation(items, false, lvl, &path.child("items"), errs);
    }
    for (k, p) in v["properties"].as_object().into_iter().flatten() {
        validate_nested_value_validation(
            p,
            false,
            Level::Field,
            &path.child("properties").key(k),
            errs,
        );
    }
    let forbidden: [(&str, &str); 12] = [
        ("type", "must be empty to be structural"),
        ("additionalProperties", "must be undefined to be structural"),
        ("default", "must be undefined to be structural"),
        ("title", "must be empty to be structural"),
        ("description", "must be empty to be structural"),
        ("nullable", "must be false to be structural"),
        (
            "x-kubernetes-preserve-unknown-fields",
            "must be false to be structural",
        ),
        (
            "x-kubernetes-embedded-resource",
            "must be false to be structural",
        ),
        (
            "x-kubernetes-int-or-string",
            "must be false to be structural",
        ),
        (
            "x-kubernetes-list-map-keys",
            "must be empty to be structural",
        ),
        (
            "x-kubernetes-list-type",
            "must be undefined to be structural",
        ),
        (
            "x-kubernetes-map-type",
            "must be undefined to be structural",
        ),
    ];
    for (key, detail) in forbidden {
        if v.get(key)
            .is_some_and(|x| x != &json!(false) && x != &json!(""))
        {
            errs.forbidden(&path.child(key), detail);
        }
    }
    if v.get("x-kubernetes-validations").is_some() {
        errs.forbidden(
            &path.child("x-kubernetes-validations"),
            "must be empty to be structural",
        );
    }
    if v["properties"].get("metadata").is_some() {
        errs.forbidden(
            &path.child("properties").key("metadata"),
            "must not be specified in a nested context",
        );
    }
}

/// complete.go: every property or items named inside a junctor exists in the structural part.
fn validate_structural_completeness(s: &Value, path: &Path, errs: &mut Errors) {
    fn nested(v: &Value, s: &Value, s_path: &Path, v_path: &Path, errs: &mut Errors) {
        for (k, p) in v["properties"].as_object().into_iter().flatten() {
            match s["properties"].get(k) {
                Some(sp) => junctors(
                    p,
                    sp,
                    &s_path.child("properties").key(k),
                    &v_path.child("properties").key(k),
                    errs,
                ),
                None => errs.required(
                    &s_path.child("properties").key(k),
                    &format!(
                        "because it is defined in {}",
                        v_path.child("properties").key(k)
                    ),
                ),
            }
        }
        if let Some(items) = v.get("items") {
            match s.get("items") {
                Some(si) => junctors(
                    items,
                    si,
                    &s_path.child("items"),
                    &v_path.child("items"),
                    errs,
                ),
                None => errs.required(
                    &s_path.child("items"),
                    &format!("because it is defined in {}", v_path.child("items")),
                ),
            }
        }
        junctors(v, s, s_path, v_path, errs);
    }
    fn junctors(v: &Value, s: &Value, s_path: &Path, v_path: &Path, errs: &mut Errors) {
        if let Some(not) = v.get("not") {
            nested(not, s, s_path, &v_path.child("not"), errs);
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            for (i, n) in v[key].as_array().into_iter().flatten().enumerate() {
                nested(n, s, s_path, &v_path.child(key).index(i), errs);
            }
        }
    }
    fn walk(s: &Value, path: &Path, errs: &mut Errors) {
        junctors(s, s, path, path, errs);
        for (k, p) in s["properties"].as_object().into_iter().flatten() {
            walk(p, &path.child("properties").key(k), errs);
        }
        if let Some(items) = s.get("items") {
            walk(items, &path.child("items"), errs);
        }
        if let Some(ap) = s.get("additionalProperties").filter(|a| a.is_object()) {
            walk(ap, &path.child("additionalProperties"), errs);
        }
    }
    walk(s, path, errs);
}

// ---------------------------------------------------------------------------------------
// apiextensions-apiserver/pkg/apiserver/schema/defaulting/validation.go: ValidateDefaults
// (validate): every default is pruned (no unknown fields) and validates against its own
// schema (kube-openapi's SchemaValidator via apiserver/validation ValidateCustomResource,
// then the node's CEL rules). additionalProperties are not followed: defaults are
// forbidden there.

fn validate_defaults(s: &Value, path: &Path, errs: &mut Errors) {
    fn walk(s: &Value, path: &Path, inside_meta: bool, is_root: bool, errs: &mut Errors) {
        if let Some(default) = s.get("default")
            && !inside_meta
        {
            let dp = path.child("default");
            let mut pruned = default.clone();
            prune(&mut pruned, s, is_root);
            if &pruned != default {
                errs.invalid(&dp, default, "must not have unknown fields");
            }
            let mut value_errs = Errors::default();
            validate_value(s, default, "", &dp, &mut value_errs);
            let value_ok = value_errs.len() == 0;
            errs.0.extend(value_errs.0);
            if value_ok
                && has_cel_rules(s)
                && let Err(cel) = Validator::new().validate(s, default, None)
            {
                for e in cel.into_vec() {
                    errs.invalid(&dp, default, &e.to_string());
                }
            }
        }
        if let Some(items) = s.get("items") {
            walk(items, &path.child("items"), inside_meta, false, errs);
        }
        for (k, p) in s["properties"].as_object().into_iter().flatten() {
            let meta = inside_meta
                || (is_root && matches!(k.as_str(), "metadata" | "apiVersion" | "kind"));
            walk(p, &path.child("properties").key(k), meta, false, errs);
        }
    }
    walk(s, path, false, true, errs);
}

fn has_cel_rules(s: &Value) -> bool {
    match s {
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k == "x-kubernetes-validations" || (k != "default" && has_cel_rules(v))),
        Value::Array(items) => items.iter().any(has_cel_rules),
        _ => false,
    }
}

/// apiextensions-apiserver/pkg/apiserver/schema/pruning/algorithm.go: Prune.
fn prune(value: &mut Value, s: &Value, is_resource_root: bool) {
    match value {
        Value::Object(map) => {
            let preserve = ext(s, "x-kubernetes-preserve-unknown-fields");
            map.retain(|k, _| {
                s["properties"].get(k).is_some()
                    || s["additionalProperties"].is_object()
                    || s["additionalProperties"] == true
                    || preserve
                    || (is_resource_root
                        && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
            });
            for (k, v) in map.iter_mut() {
                if let Some(p) = s["properties"].get(k) {
                    prune(v, p, ext(p, "x-kubernetes-embedded-resource"));
                } else if s["additionalProperties"].is_object() {
                    prune(v, &s["additionalProperties"], false);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                prune(item, &s["items"], false);
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------
// kube-openapi pkg/validation/validate: SchemaValidator.Validate for one value (schema.go,
// type.go, object_validator.go, slice_validator.go, validator.go: numberValidator,
// stringValidator, basicCommonValidator; values.go). Errors become field errors as in
// apiextensions-apiserver/pkg/apiserver/validation/validation.go
// (kubeOpenAPIResultToFieldErrors): validation errors at `<field>.<name>` with their value,
// plain errors (the boundary checks) at `<field>` with value "".

/// kube-openapi values.go: IsValueValidAgainstRange. The value is printed as Go's
/// strconv.FormatFloat(v, 'f', -1, 64) (Rust's shortest round-trip Display prints the same
/// digits) and parsed back with strconv.ParseInt(s, 10, bits) for the format.
fn is_value_valid_against_range(
    value: &Value,
    type_name: &str,
    format: &str,
    prefix: &str,
    path: &str,
) -> Result<(), String> {
    // Go formats integers as integers (FormatInteger) and floats with FormatFloat.
    let shown = match value.as_number() {
        Some(n) if n.is_i64() || n.is_u64() => n.to_string(),
        Some(n) => format!("{}", n.as_f64().unwrap()),
        None => {
            return Err(format!(
                "{prefix} value number range checking called with invalid (non numeric) val type in {path}"
            ));
        }
    };
    let ok = match type_name {
        "integer" => match format {
            "int32" => shown.parse::<i32>().is_ok(),
            "uint32" => shown.parse::<u32>().is_ok(),
            "uint64" => shown.parse::<u64>().is_ok(),
            _ => shown.parse::<i64>().is_ok(),
        },
        _ => match format {
            "float" | "float32" => shown
                .parse::<f64>()
                .is_ok_and(|f| f.is_finite() && f.abs() <= f64::from(f32::MAX)),
            _ => true,
        },
    };
    if ok {
        Ok(())
    } else if format.is_empty() {
        Err(format!(
            "{prefix} value must be of type {type_name} (default format) in {path}"
        ))
    } else {
        Err(format!(
            "{prefix} value must be of type {type_name} with format {format} in {path}"
        ))
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Evaluates `value.matches(pattern)` with kube-cel (RE2 syntax, as Go's regexp). Err: the
/// pattern does not compile.
fn regex_matches(pattern: &str, value: &str) -> Result<bool, String> {
    let rule = format!("self.matches({})", serde_json::to_string(pattern).unwrap());
    let schema = json!({"type": "string", "x-kubernetes-validations": [{"rule": rule}]});
    match Validator::new().validate(&schema, &json!(value), None) {
        Ok(()) => Ok(true),
        Err(errors) => {
            let errors = errors.into_vec();
            if errors
                .iter()
                .all(|e| matches!(e.kind, ErrorKind::ValidationFailure))
            {
                Ok(false)
            } else {
                Err(errors
                    .iter()
                    .map(|e| e.message.clone())
                    .collect::<Vec<_>>()
                    .join("; "))
            }
        }
    }
}

/// `name` is the value's path inside the validated value ("" at its root, dotted below).
fn validate_value(s: &Value, value: &Value, name: &str, field: &Path, errs: &mut Errors) {
    let at = |name: &str| -> Path {
        if name.is_empty() {
            field.clone()
        } else {
            field.child(name)
        }
    };
    let sub = |key: &str| -> String {
        if name.is_empty() {
            key.to_string()
        } else {
            format!("{name}.{key}")
        }
    };
    // kube-openapi's errors name the value by its path inside the validated value.
    let body = name;
    // schema.go: null is accepted only where nullable.
    if value.is_null() {
        if s["nullable"] != true && s.get("type").is_some() {
            errs.invalid(
                &at(name),
                &json!("null"),
                &format!(
                    "{body} in body must be of type {}: \"null\"",
                    s["type"].as_str().unwrap_or_default()
                ),
            );
        }
        return;
    }
    // type.go: typeValidator (x-kubernetes-int-or-string is type [integer, string]).
    let got = json_type(value);
    if ext(s, "x-kubernetes-int-or-string") {
        if got != "integer" && got != "string" {
            errs.invalid(
                &at(name),
                value,
                &format!("{body} in body must be of type integer,string: {got:?}"),
            );
            return;
        }
    } else if let Some(ty) = s["type"].as_str()
        && !(got == ty || (ty == "number" && got == "integer"))
    {
        errs.invalid(
            &at(name),
            value,
            &format!("{body} in body must be of type {ty}: {got:?}"),
        );
        return;
    }
    // validator.go: basicCommonValidator (enum).
    if let Some(allowed) = s["enum"].as_array()
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed
            .iter()
            .map(|a| {
                a.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| a.to_string())
            })
            .collect();
        let list: Vec<&str> = list.iter().map(String::as_str).collect();
        errs.not_supported(&at(name), value, &list);
    }
    // validator.go: numberValidator.Validate.
    if let Some(n) = value.as_f64() {
        let ty = s["type"].as_str().unwrap_or_default();
        let format = s["format"].as_str().unwrap_or_default();
        if let Err(e) = is_value_valid_against_range(value, ty, format, "Checked", name) {
            errs.invalid(field, &json!(""), &e);
        }
        for (key, prefix) in [
            ("multipleOf", "MultipleOf"),
            ("maximum", "Maximum boundary"),
            ("minimum", "Minimum boundary"),
        ] {
            let Some(bound) = s[key].as_f64() else {
                continue;
            };
            if let Err(e) = is_value_valid_against_range(&s[key], ty, format, prefix, name) {
                errs.invalid(field, &json!(""), &e);
            }
            let exclusive = |k: &str| s[k] == true;
            let fails = match key {
                "maximum" if exclusive("exclusiveMaximum") => n >= bound,
                "maximum" => n > bound,
                "minimum" if exclusive("exclusiveMinimum") => n <= bound,
                "minimum" => n < bound,
                _ => bound > 0.0 && (n / bound).fract() != 0.0,
            };
            if fails {
                let detail = match key {
                    "maximum" => format!("{body} in body should be less than or equal to {bound}"),
                    "minimum" => {
                        format!("{body} in body should be greater than or equal to {bound}")
                    }
                    _ => format!("{body} in body should be a multiple of {bound}"),
                };
                errs.invalid(&at(name), value, &detail);
            }
        }
    }
    // validator.go: stringValidator.
    if let Some(text) = value.as_str() {
        let len = text.chars().count() as u64;
        if let Some(max) = s["maxLength"].as_u64()
            && len > max
        {
            errs.0.push(format!(
                "{}: Too long: may not be more than {max} bytes",
                at(name)
            ));
        }
        if let Some(min) = s["minLength"].as_u64()
            && len < min
        {
            errs.invalid(
                &at(name),
                value,
                &format!("{body} in body should be at least {min} chars long"),
            );
        }
        if let Some(pattern) = s["pattern"].as_str()
            && regex_matches(pattern, text) != Ok(true)
        {
            errs.invalid(
                &at(name),
                value,
                &format!("{body} in body should match '{pattern}'"),
            );
        }
    }
    // slice_validator.go.
    if let Some(items) = value.as_array() {
        if let Some(max) = s["maxItems"].as_u64()
            && items.len() as u64 > max
        {
            errs.0.push(format!(
                "{}: Too many: {}: must have at most {max} items",
                at(name),
                items.len()
            ));
        }
        if let Some(min) = s["minItems"].as_u64()
            && (items.len() as u64) < min
        {
            errs.invalid(
                &at(name),
                value,
                &format!("{body} in body should have at least {min} items"),
            );
        }
        if let Some(item_schema) = s.get("items") {
            for (i, item) in items.iter().enumerate() {
                validate_value(item_schema, item, &sub(&i.to_string()), field, errs);
            }
        }
    }
    // object_validator.go.
    if let Some(object) = value.as_object() {
        for key in s["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !object.contains_key(key) {
                errs.required(&at(&sub(key)), "");
            }
        }
        for (key, v) in object {
            if let Some(p) = s["properties"].get(key) {
                validate_value(p, v, &sub(key), field, errs);
            } else if s["additionalProperties"].is_object() {
                validate_value(&s["additionalProperties"], v, &sub(key), field, errs);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// validation.go: ValidateCustomResourceDefinitionOpenAPISchema, specStandardValidatorV3
// (validate), validateMapListKeysMapSet, and the x-kubernetes-validations checks.

#[derive(Clone, Default)]
struct SpecStandardValidator {
    /// withForbiddenDefaults: the reason, when defaults are forbidden.
    forbidden_defaults: Option<String>,
    /// withInsideResourceMeta.
    inside_resource_meta: bool,
}

const OPENAPI_V3_TYPES: [&str; 6] = ["array", "boolean", "integer", "number", "object", "string"];

/// specStandardValidatorV3.validate.
fn spec_standard_validate(ssv: &SpecStandardValidator, s: &Value, path: &Path, errs: &mut Errors) {
    if let Some(ty) = s["type"].as_str()
        && !ty.is_empty()
        && !OPENAPI_V3_TYPES.contains(&ty)
    {
        errs.not_supported(&path.child("type"), &json!(ty), &OPENAPI_V3_TYPES);
    }
    if s.get("default").is_some()
        && let Some(reason) = &ssv.forbidden_defaults
    {
        errs.forbidden(&path.child("default"), &format!("must not be set {reason}"));
    }
    for (key, detail) in [
        ("id", "id is not supported"),
        ("additionalItems", "additionalItems is not supported"),
        ("patternProperties", "patternProperties is not supported"),
        ("definitions", "definitions is not supported"),
        ("dependencies", "dependencies is not supported"),
        ("$ref", "$ref is not supported"),
    ] {
        if s.get(key).is_some() {
            errs.forbidden(&path.child(key), detail);
        }
    }
    if s["type"] == "null" {
        errs.forbidden(
            &path.child("type"),
            "type cannot be set to null, use nullable as an alternative",
        );
    }
    if s["items"].is_array() {
        errs.forbidden(
            &path.child("items"),
            "items must be a schema object and not an array",
        );
    }
    if ssv.inside_resource_meta && ext(s, "x-kubernetes-embedded-resource") {
        errs.forbidden(
            &path.child("x-kubernetes-embedded-resource"),
            "must not be used inside of resource meta",
        );
    }
}

fn validate_openapi_schema(
    s: &Value,
    path: &Path,
    ssv: &SpecStandardValidator,
    is_root: bool,
    errs: &mut Errors,
) {
    if !s.is_object() {
        return;
    }
    spec_standard_validate(ssv, s, path, errs);
    if s["uniqueItems"] == true {
        errs.forbidden(
            &path.child("uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        );
    }
    let props = s["properties"].as_object().filter(|p| !p.is_empty());
    if let Some(ap) = s.get("additionalProperties") {
        if props.is_some() && (ap == &json!(false) || ap.is_object()) {
            errs.forbidden(
                &path.child("additionalProperties"),
                "additionalProperties and properties are mutual exclusive",
            );
        }
        let mut sub = ssv.clone();
        if ssv.inside_resource_meta {
            sub.forbidden_defaults =
                Some("inside additionalProperties applying to object metadata".into());
        }
        validate_openapi_schema(ap, &path.child("additionalProperties"), &sub, false, errs);
    }
    for (k, p) in props.into_iter().flatten() {
        let mut sub = ssv.clone();
        if (is_root || ext(s, "x-kubernetes-embedded-resource"))
            && matches!(k.as_str(), "metadata" | "kind" | "apiVersion")
        {
            sub.inside_resource_meta = true;
            if is_root {
                sub.forbidden_defaults = Some(format!("in top-level {k}"));
            }
        }
        validate_openapi_schema(p, &path.child("properties").key(k), &sub, false, errs);
    }
    if let Some(not) = s.get("not") {
        validate_openapi_schema(not, &path.child("not"), ssv, false, errs);
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        for (i, n) in s[key].as_array().into_iter().flatten().enumerate() {
            validate_openapi_schema(n, &path.child(key).index(i), ssv, false, errs);
        }
    }
    if let Some(items) = s.get("items") {
        validate_openapi_schema(items, &path.child("items"), ssv, false, errs);
    }

    let ty = s["type"].as_str().unwrap_or_default();
    if s["x-kubernetes-preserve-unknown-fields"] == false {
        errs.invalid(
            &path.child("x-kubernetes-preserve-unknown-fields"),
            &json!(false),
            "must be true or undefined",
        );
    }
    if let Some(map_type) = s.get("x-kubernetes-map-type") {
        if ty != "object" {
            if ty.is_empty() {
                errs.required(
                    &path.child("type"),
                    "must be object if x-kubernetes-map-type is specified",
                );
            } else {
                errs.invalid(
                    &path.child("type"),
                    &json!(ty),
                    "must be object if x-kubernetes-map-type is specified",
                );
            }
        }
        if map_type != "atomic" && map_type != "granular" {
            errs.not_supported(
                &path.child("x-kubernetes-map-type"),
                map_type,
                &["atomic", "granular"],
            );
        }
    }
    let list_type = s["x-kubernetes-list-type"].as_str();
    if list_type.is_some() && ty != "array" {
        if ty.is_empty() {
            errs.required(
                &path.child("type"),
                "must be array if x-kubernetes-list-type is specified",
            );
        } else {
            errs.invalid(
                &path.child("type"),
                &json!(ty),
                "must be array if x-kubernetes-list-type is specified",
            );
        }
    } else if list_type == Some("set") && s["items"].is_object() {
        // requireAtomicSetType.
        let is = &s["items"];
        match is["type"].as_str() {
            Some("array")
                if is
                    .get("x-kubernetes-list-type")
                    .is_some_and(|t| t != "atomic") =>
            {
                errs.invalid(
                    &path.child("items").child("x-kubernetes-list-type"),
                    &is["x-kubernetes-list-type"],
                    "must be atomic as item of a list with x-kubernetes-list-type=set",
                )
            }
            Some("object") if is["x-kubernetes-map-type"] != "atomic" => errs.invalid(
                &path.child("items").child("x-kubernetes-map-type"),
                &is["x-kubernetes-list-type"],
                "must be atomic as item of a list with x-kubernetes-list-type=set",
            ),
            _ => {}
        }
    }
    if let Some(lt) = list_type
        && !matches!(lt, "atomic" | "set" | "map")
    {
        errs.not_supported(
            &path.child("x-kubernetes-list-type"),
            &json!(lt),
            &["atomic", "set", "map"],
        );
    }
    let map_keys: Vec<&str> = s["x-kubernetes-list-map-keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !map_keys.is_empty() {
        match list_type {
            None => errs.required(
                &path.child("x-kubernetes-list-type"),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            ),
            Some("map") => {}
            Some(other) => errs.invalid(
                &path.child("x-kubernetes-list-type"),
                &json!(other),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            ),
        }
    }
    if list_type == Some("map") {
        let keys_value = &s["x-kubernetes-list-map-keys"];
        if map_keys.is_empty() {
            errs.required(
                &path.child("x-kubernetes-list-map-keys"),
                "must not be empty if x-kubernetes-list-type is map",
            );
        }
        match s.get("items") {
            None => errs.required(
                &path.child("items"),
                "must have a schema if x-kubernetes-list-type is map",
            ),
            Some(items) if !items.is_object() => errs.invalid(
                &path.child("items"),
                items,
                "must only have a single schema if x-kubernetes-list-type is map",
            ),
            Some(items) if items["type"] != "object" => errs.invalid(
                &path.child("items").child("type"),
                &items["type"],
                "must be object if parent array's x-kubernetes-list-type is map",
            ),
            Some(items) => {
                let mut seen = std::collections::BTreeSet::new();
                for k in &map_keys {
                    match items["properties"].get(*k) {
                        Some(p) if matches!(p["type"].as_str(), Some("array" | "object")) => errs.invalid(
                            &path.child("items").child("properties").key(k).child("type"),
                            &items["type"],
                            "must be a scalar type if parent array's x-kubernetes-list-type is map",
                        ),
                        Some(_) => {}
                        None => errs.invalid(&path.child("x-kubernetes-list-map-keys"), keys_value, "entries must all be names of item properties"),
                    }
                    if !seen.insert(*k) {
                        errs.invalid(
                            &path.child("x-kubernetes-list-map-keys"),
                            keys_value,
                            "must not contain duplicate entries",
                        );
                    }
                }
            }
        }
    }
    validate_map_list_keys_map_set(s, path, errs);
    validate_x_validations(s, path, errs);
}

/// validation.go: validateMapListKeysMapSet (requireMapListKeysMapSetValidation).
fn validate_map_list_keys_map_set(s: &Value, path: &Path, errs: &mut Errors) {
    let Some(list_type) = s["x-kubernetes-list-type"].as_str() else {
        return;
    };
    let items = &s["items"];
    if !items.is_object() || !matches!(list_type, "set" | "map") {
        return;
    }
    if items["nullable"] == true {
        errs.forbidden(
            &path.child("items").child("nullable"),
            &format!("cannot be nullable when x-kubernetes-list-type is {list_type}"),
        );
    }
    if list_type == "map" {
        let required: Vec<&str> = items["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        for k in s["x-kubernetes-list-map-keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            let Some(p) = items["properties"].get(k) else {
                continue;
            };
            let kp = path.child("items").child("properties").key(k);
            if !required.contains(&k) && p.get("default").is_none() {
                errs.required(
                    &kp.child("default"),
                    "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                );
            }
            if p["nullable"] == true {
                errs.forbidden(
                    &kp.child("nullable"),
                    "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                );
            }
        }
    }
}

/// validation.go: the static x-kubernetes-validations checks in
/// ValidateCustomResourceDefinitionOpenAPISchema (rule, message, reason, fieldPath).
fn validate_x_validations(s: &Value, path: &Path, errs: &mut Errors) {
    const REASONS: [&str; 4] = [
        "FieldValueDuplicate",
        "FieldValueForbidden",
        "FieldValueInvalid",
        "FieldValueRequired",
    ];
    let has_newlines = |t: &str| t.contains(['\n', '\r']);
    for (i, rule) in s["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let rp = path.child("x-kubernetes-validations").index(i);
        let text = rule["rule"].as_str().unwrap_or_default().trim();
        let message = rule["message"].as_str().unwrap_or_default();
        if text.is_empty() {
            errs.required(&rp.child("rule"), "rule is not specified");
        } else if !message.is_empty() && message.trim().is_empty() {
            errs.invalid(
                &rp.child("message"),
                &json!(message),
                "message must be non-empty if specified",
            );
        } else if has_newlines(message.trim()) {
            errs.invalid(
                &rp.child("message"),
                &json!(message),
                "message must not contain line breaks",
            );
        } else if has_newlines(text) && message.trim().is_empty() {
            errs.required(
                &rp.child("message"),
                "message must be specified if rule contains line breaks",
            );
        }
        if let Some(expr) = rule["messageExpression"].as_str()
            && expr.trim().is_empty()
        {
            errs.required(
                &rp.child("messageExpression"),
                "messageExpression must be non-empty if specified",
            );
        }
        if let Some(reason) = rule["reason"].as_str()
            && !REASONS.contains(&reason)
        {
            errs.not_supported(&rp.child("reason"), &json!(reason), &REASONS);
        }
        if let Some(fp) = rule["fieldPath"].as_str() {
            if fp.trim().is_empty() {
                errs.invalid(
                    &rp.child("fieldPath"),
                    &json!(fp),
                    "fieldPath must be non-empty if specified",
                );
            } else if has_newlines(fp) {
                errs.invalid(
                    &rp.child("fieldPath"),
                    &json!(fp),
                    "fieldPath must not contain line breaks",
                );
            } else if !field_path_valid(s, fp) {
                // pathValid -> cel.ValidFieldPath: dotted properties of this node's schema.
                errs.invalid(
                    &rp.child("fieldPath"),
                    &json!(fp),
                    "fieldPath must be a valid path",
                );
            }
        }
    }
}

/// apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go ValidFieldPath, for the
/// dotted form (`.a.b`, no brackets): every step is a property of the schema.
fn field_path_valid(s: &Value, path: &str) -> bool {
    let Some(rest) = path.strip_prefix('.') else {
        return false;
    };
    let mut node = s;
    for step in rest.split('.') {
        match node["properties"].get(step) {
            Some(next) => node = next,
            None if node["additionalProperties"].is_object() => {
                node = &node["additionalProperties"]
            }
            None => return false,
        }
    }
    true
}

/// validation.go: the CEL compilation step (cel.Compile) for every x-kubernetes-validations
/// rule, here through kube-cel.
fn compile_cel_rules(s: &Value, path: &Path, errs: &mut Errors) {
    fn walk(compiled: &kube::core::cel::CompiledSchema, s: &Value, path: &Path, errs: &mut Errors) {
        for (i, e) in compiled
            .validations
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().err().map(|e| (i, e)))
        {
            let rp = path
                .child("x-kubernetes-validations")
                .index(i)
                .child("rule");
            errs.invalid(&rp, &s["x-kubernetes-validations"][i], &e.to_string());
        }
        for (k, c) in &compiled.properties {
            walk(
                c,
                &s["properties"][k],
                &path.child("properties").key(k),
                errs,
            );
        }
        if let Some(c) = &compiled.items {
            walk(c, &s["items"], &path.child("items"), errs);
        }
        if let Some(c) = &compiled.additional_properties {
            walk(
                c,
                &s["additionalProperties"],
                &path.child("additionalProperties"),
                errs,
            );
        }
    }
    walk(&compile_schema(s), s, path, errs);
}

// ---------------------------------------------------------------------------------------
// Not a CRD-creation rule, but the same kube-openapi numberValidator runs on every object:
// an integer field whose bound is no integer of its format fails every object that sets
// the field ("Maximum boundary value must be of type integer with format int64 in
// spec.trainer.checkpoint.everySeconds"; "(default format)" where the validator was built
// with StripUnsupportedFormatsPostProcess, which drops int32/int64: the int64 range then
// applies, so this check, which keeps the format, is the stricter one), even where the field
// has no default.

fn integer_bounds_for_objects(s: &Value, name: &str, errs: &mut Errors) {
    if s["type"] == "integer" {
        let format = s["format"].as_str().unwrap_or_default();
        for (key, prefix) in [
            ("maximum", "Maximum boundary"),
            ("minimum", "Minimum boundary"),
            ("multipleOf", "MultipleOf"),
        ] {
            if s[key].is_number()
                && let Err(e) =
                    is_value_valid_against_range(&s[key], "integer", format, prefix, name)
            {
                errs.0.push(format!("<nil>: Invalid value: \"\": {e}"));
            }
        }
    }
    for (k, p) in s["properties"].as_object().into_iter().flatten() {
        let sub = if name.is_empty() {
            k.clone()
        } else {
            format!("{name}.{k}")
        };
        integer_bounds_for_objects(p, &sub, errs);
    }
    if let Some(items) = s.get("items") {
        integer_bounds_for_objects(items, &format!("{name}[*]"), errs);
    }
    if let Some(ap) = s.get("additionalProperties").filter(|a| a.is_object()) {
        integer_bounds_for_objects(ap, &format!("{name}[*]"), errs);
    }
}

// ---------------------------------------------------------------------------------------
// The tests.

fn generated() -> Value {
    serde_json::to_value(custom_resource_definition()).unwrap()
}

/// The CRD as users apply it: each committed YAML, plus the generated one.
fn crds_as_applied() -> Vec<(String, Value)> {
    let mut crds = vec![("generated".to_string(), generated())];
    for path in [
        "crds/distributedtrainings.yaml",
        "charts/ferrotrain/crds/distributedtrainings.yaml",
    ] {
        let text = std::fs::read_to_string(repo_root().join(path)).unwrap();
        crds.push((path.to_string(), serde_saphyr::from_str(&text).unwrap()));
    }
    crds
}

fn schema_of(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

#[test]
fn the_api_server_accepts_the_crd() {
    let mut failures = Vec::new();
    for (what, crd) in crds_as_applied() {
        let errors = validate_custom_resource_definition(&crd);
        if !errors.is_empty() {
            failures.push(format!(
                "{what}: The CustomResourceDefinition is invalid ({} errors):\n* {}",
                errors.len(),
                errors.join("\n* ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_integer_bound_fits_its_format() {
    let mut failures = Vec::new();
    for (what, crd) in crds_as_applied() {
        let mut errs = Errors::default();
        integer_bounds_for_objects(schema_of(&crd), "", &mut errs);
        if errs.len() > 0 {
            failures.push(format!("{what}:\n* {}", errs.0.join("\n* ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The rules reject what the API server rejects: today's CRD with one thing broken, one row
/// per rule, and the message the API server gives.
#[test]
fn the_rules_reject_what_the_api_server_rejects() {
    let every_steps = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/trainer/properties/checkpoint/properties/everySteps";
    type Break = Box<dyn Fn(&mut Value)>;
    let set = |pointer: &'static str, value: Value| -> Break {
        Box::new(move |crd: &mut Value| {
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            crd.pointer_mut(parent).unwrap()[key] = value.clone();
        })
    };
    let remove = |pointer: &'static str, key: &'static str| -> Break {
        Box::new(move |crd: &mut Value| {
            crd.pointer_mut(pointer)
                .unwrap()
                .as_object_mut()
                .unwrap()
                .remove(key);
        })
    };
    let cases: Vec<(&str, Break, &[&str])> = vec![
        (
            // Issue 10: what v1.36 said about the CRD of commit 08e9e5b.
            "int64 field with a default and maximum 2^63",
            Box::new(move |crd: &mut Value| {
                let field = crd.pointer_mut(every_steps).unwrap();
                field["maximum"] = json!(9.223372036854776e18);
                field["default"] = json!(500);
            }),
            &[
                "spec.validation.openAPIV3Schema.properties[spec].properties[trainer].properties[checkpoint].properties[everySteps].default: Invalid value: \"\": Maximum boundary value must be of type integer with format int64",
            ],
        ),
        (
            "int32 field with maximum 2^32 - 1",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/restartPolicy/properties/maxRestarts/maximum",
                json!(4294967295.0),
            ),
            &[
                "properties[maxRestarts].default: Invalid value: \"\": Maximum boundary value must be of type integer with format int32",
            ],
        ),
        (
            "fractional minimum on an integer",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/stallTimeoutSeconds/minimum",
                json!(0.5),
            ),
            &[
                "properties[stallTimeoutSeconds].default: Invalid value: \"\": Minimum boundary value must be of type integer with format int64",
            ],
        ),
        (
            "default outside the bounds",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/stallTimeoutSeconds/maximum",
                json!(60),
            ),
            &[
                "properties[stallTimeoutSeconds].default: Invalid value: 1800: ",
                "in body should be less than or equal to 60",
            ],
        ),
        (
            "default not in the enum",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/stallTimeoutSeconds/enum",
                json!([0, 60]),
            ),
            &["properties[stallTimeoutSeconds].default: Unsupported value: 1800"],
        ),
        (
            "default not matching the pattern",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/checkpoint/properties/mountPath/default",
                json!("checkpoints"),
            ),
            &[
                "properties[mountPath].default: Invalid value: \"checkpoints\": ",
                "in body should match '^/'",
            ],
        ),
        (
            "default with an unknown field",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/restartPolicy/default/retries",
                json!(3),
            ),
            &[
                "properties[restartPolicy].default: Invalid value: {",
                "must not have unknown fields",
            ],
        ),
        (
            "default breaking the node's CEL rule",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/restartPolicy/default/maxBackoffSeconds",
                json!(1),
            ),
            &[
                "properties[restartPolicy].default: Invalid value: {",
                "maxBackoffSeconds must be at least",
            ],
        ),
        (
            "a field without a type",
            remove(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/suspend",
                "type",
            ),
            &[
                "properties[suspend].type: Required value: must not be empty for specified object fields",
            ],
        ),
        (
            "an array without items",
            remove(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/args",
                "items",
            ),
            &["properties[args].items: Required value: must be specified"],
        ),
        (
            "properties and additionalProperties together",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/additionalProperties",
                json!({"type": "string"}),
            ),
            &[
                "properties[spec].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive",
            ],
        ),
        (
            "list-map key neither required nor defaulted",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/conditions/items/required",
                json!(["status"]),
            ),
            &[
                "properties[conditions].items.properties[type].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
            ],
        ),
        (
            "metadata restricted beyond name",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/metadata",
                json!({"type": "object", "properties": {"labels": {"type": "object"}}}),
            ),
            &[
                "openAPIV3Schema.properties[metadata]: Forbidden: must not specify anything other than name and generateName",
            ],
        ),
        (
            "a root field the status subresource forbids",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/nullable",
                json!(true),
            ),
            &["openAPIV3Schema.nullable: Forbidden: nullable cannot be true at the root"],
        ),
        (
            "uniqueItems",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/args/uniqueItems",
                json!(true),
            ),
            &["properties[args].uniqueItems: Forbidden: uniqueItems cannot be set to true"],
        ),
        (
            "a printer column path that is no JSON path",
            set(
                "/spec/versions/0/additionalPrinterColumns/0/jsonPath",
                json!("status.phase"),
            ),
            &[
                "spec.additionalPrinterColumns[0].JSONPath: Invalid value: \"status.phase\": must be a simple json path starting with .",
            ],
        ),
        (
            "a printer column type Kubernetes does not know",
            set(
                "/spec/versions/0/additionalPrinterColumns/0/type",
                json!("enum"),
            ),
            &[
                "spec.additionalPrinterColumns[0].type: Invalid value: \"enum\": must be one of boolean,date,integer,number,string",
            ],
        ),
        (
            "a CEL rule that does not compile",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/x-kubernetes-validations/0/rule",
                json!("has(self.trainer) ||"),
            ),
            &["properties[spec].x-kubernetes-validations[0].rule: Invalid value"],
        ),
        (
            "a CEL fieldPath to no field",
            set(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/x-kubernetes-validations/0/fieldPath",
                json!(".trainr"),
            ),
            &[
                "properties[spec].x-kubernetes-validations[0].fieldPath: Invalid value: \".trainr\": fieldPath must be a valid path",
            ],
        ),
        (
            "the name is not plural.group",
            set("/metadata/name", json!("dts.ferrotrain.dev")),
            &[
                "metadata.name: Invalid value: \"dts.ferrotrain.dev\": must be spec.names.plural+\".\"+spec.group",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (what, break_it, expected) in cases {
        let mut crd = generated();
        break_it(&mut crd);
        let errors = validate_custom_resource_definition(&crd);
        eprintln!("{what}: {errors:#?}");
        if !errors
            .iter()
            .any(|e| expected.iter().all(|x| e.contains(x)))
        {
            failures.push(format!("{what}: expected {expected:?} in {errors:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 10's CRD: every integer field kept its 2^63 maximum on objects too.
#[test]
fn a_bound_past_int64_fails_every_object_that_sets_the_field() {
    let schema = json!({"type": "object", "properties": {"checkpoint": {"type": "object", "properties": {
        "everySeconds": {"type": "integer", "format": "int64", "minimum": 1.0, "maximum": 9.223372036854776e18},
        "keepLatest": {"type": "integer", "format": "int64", "minimum": 1.0, "maximum": 4294967295.0},
    }}}});
    let mut errs = Errors::default();
    integer_bounds_for_objects(&schema, "spec", &mut errs);
    assert_eq!(
        errs.0,
        [
            "<nil>: Invalid value: \"\": Maximum boundary value must be of type integer with format int64 in spec.checkpoint.everySeconds"
        ]
    );
}

/// The Go formatting the range check relies on: FormatFloat(f, 'f', -1, 64), the shortest
/// digits that read back as f, padded with zeros (2^63 prints as 9223372036854776000, which
/// ParseInt refuses as out of range, like 9223372036854775808 would be).
#[test]
fn bounds_print_as_go_prints_them() {
    assert_eq!(
        format!("{}", 9.223372036854776e18_f64),
        "9223372036854776000"
    );
    assert_eq!(format!("{}", 4294967295.0_f64), "4294967295");
    assert_eq!(format!("{}", 1.0_f64), "1");
    assert_eq!(format!("{}", 0.5_f64), "0.5");
    let check = |v: Value, format: &str| {
        is_value_valid_against_range(&v, "integer", format, "Maximum boundary", "x")
    };
    assert!(check(json!(9_223_372_036_854_774_784.0), "int64").is_ok());
    assert!(check(json!(9.223372036854776e18), "int64").is_err());
    assert!(check(json!(i64::MAX), "int64").is_ok());
    assert!(check(json!(2147483647.0), "int32").is_ok());
    assert!(check(json!(2147483648.0), "int32").is_err());
    assert!(check(json!(1.5), "int64").is_err());
}
