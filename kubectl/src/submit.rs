//! `submit`: the object is built from the file and the flags (src/submit/manifest.rs), then
//! checked here before anything is sent, each problem naming its field: against the CRD's
//! schema (src/submit/schema.rs) and its CEL rules (kube-cel), then by serde into the very
//! types the operator reads (a type error names its path), then by the trainer's own
//! validation of its config. The API server then checks it in a server-side dry run, and only
//! then is it created.

pub mod manifest;
pub mod schema;

use std::path::Path;

use ferrotrain_api::crd::{DistributedTraining, GROUP, VERSION};
use kube::Api;
use kube::api::PostParams;
use serde_json::Value;

use crate::cli::{DryRun, SubmitArgs};
use crate::connect::Cluster;
use crate::error::{Error, Result};
use crate::problem::Problem;
use manifest::{FLAG_FIELDS, Manifest, Overrides, Source};

/// The field manager of what the plugin writes.
pub const FIELD_MANAGER: &str = "kubectl-ferrotrain";

/// The job `text` describes, with `overrides`, in `namespace`, once it passes every local
/// check; else every problem, named as the user wrote the field (a trainer config's fields
/// without `spec.trainer.`, a flag's field with the flag).
pub fn prepare(
    text: &str,
    origin: &str,
    stem: Option<&str>,
    overrides: &Overrides,
    namespace: &str,
) -> Result<(DistributedTraining, Manifest)> {
    let manifest = manifest::read(text, origin, stem)?;
    let mut object = manifest::apply(manifest.object.clone(), overrides);
    object["metadata"]["namespace"] = Value::from(namespace);
    let invalid = |problems: Vec<Problem>| Error::Invalid {
        origin: origin.to_string(),
        problems: problems
            .into_iter()
            .map(|p| as_written(p, manifest.source))
            .collect(),
    };
    let problems = local_problems(&object);
    if !problems.is_empty() {
        return Err(invalid(problems));
    }
    let dt: DistributedTraining = serde_path_to_error::deserialize(object).map_err(|e| {
        invalid(vec![Problem::new(
            &e.path().to_string(),
            &e.inner().to_string(),
        )])
    })?;
    let trainer_problems: Vec<Problem> = dt
        .spec
        .trainer
        .as_ref()
        .map(|t| t.validate())
        .unwrap_or_default()
        .into_iter()
        .map(|e| Problem::new(&format!("spec.trainer.{}", e.path), &e.reason))
        .collect();
    if !trainer_problems.is_empty() {
        return Err(invalid(trainer_problems));
    }
    Ok((dt, manifest))
}

/// The schema's and its rules' problems with `object`.
fn local_problems(object: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    let kind = format!("{GROUP}/{VERSION}");
    if object["apiVersion"] != kind.as_str() {
        problems.push(Problem::new(
            "apiVersion",
            &format!("must be {kind}, got {}", object["apiVersion"]),
        ));
    }
    if !object["metadata"]["name"].is_string() {
        problems.push(Problem::new(
            "metadata.name",
            "is required: give --name (a trainer config's job is named after its file)",
        ));
        return problems;
    }
    let schema = schema::crd_schema();
    problems.extend(schema::check(object, &schema));
    if problems.is_empty()
        && let Err(errors) = kube::core::cel::Validator::new().validate(&schema, object, None)
    {
        problems.extend(
            errors
                .into_vec()
                .into_iter()
                .map(|e| Problem::new(e.field_path.trim_start_matches('.'), &e.message)),
        );
    }
    problems
}

/// `problem` with its field as the user wrote it.
fn as_written(mut problem: Problem, source: Source) -> Problem {
    if let Some((flag, _)) = FLAG_FIELDS.iter().find(|(_, f)| *f == problem.path) {
        problem.path = format!("{} ({flag})", problem.path);
    } else if source == Source::TrainerConfig
        && let Some(field) = problem.path.strip_prefix("spec.trainer.")
    {
        problem.path = field.to_string();
    }
    problem
}

/// Runs `submit`; the job's name once it is created (None for a dry run).
pub async fn submit(cluster: &Cluster, args: &SubmitArgs) -> Result<Option<String>> {
    let (text, origin) = read_input(&args.file)?;
    let stem = args
        .file
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| *s != "-");
    let overrides = Overrides {
        name: args.name.clone(),
        replicas: args.replicas,
        procs: args.procs,
        gpus: args.gpus,
        claim: args.claim.clone(),
        image: args.image.clone(),
    };
    let namespace = namespace_of(&text, &origin, cluster)?;
    let (dt, manifest) = prepare(&text, &origin, stem, &overrides, &namespace)?;
    for skipped in &manifest.skipped {
        eprintln!("{origin}: {skipped} left out: `kubectl apply -f {origin}` creates it");
    }
    let name = dt.metadata.name.clone().unwrap_or_default();
    if args.dry_run == Some(DryRun::Client) {
        print!("{}", serde_saphyr::to_string(&dt).unwrap_or_default());
        return Ok(None);
    }
    let jobs: Api<DistributedTraining> = Api::namespaced(cluster.client.clone(), &namespace);
    let dry = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.to_string()),
    };
    jobs.create(&dry, &dt)
        .await
        .map_err(refused(&name, &namespace))?;
    if args.dry_run == Some(DryRun::Server) {
        println!("distributedtraining.{GROUP}/{name} created (server dry run)");
        return Ok(None);
    }
    let create = PostParams {
        dry_run: false,
        ..dry
    };
    jobs.create(&create, &dt)
        .await
        .map_err(refused(&name, &namespace))?;
    println!("distributedtraining.{GROUP}/{name} created");
    Ok(Some(name))
}

/// The file's text and its name for messages (`-`: stdin).
fn read_input(path: &Path) -> Result<(String, String)> {
    let origin = path.display().to_string();
    let text = if origin == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    };
    text.map(|t| (t, origin.clone()))
        .map_err(|source| Error::Read {
            path: origin,
            source,
        })
}

/// The namespace of the job: the manifest's, which `--namespace` may not contradict, else the
/// command's (kubectl's rule).
fn namespace_of(text: &str, origin: &str, cluster: &Cluster) -> Result<String> {
    let own = manifest::read(text, origin, None).ok().and_then(|m| {
        m.object["metadata"]["namespace"]
            .as_str()
            .map(str::to_string)
    });
    match own {
        Some(ns) if cluster.namespace_given && ns != cluster.namespace => {
            Err(Error::Usage(format!(
                "the namespace of {origin} ({ns}) does not match --namespace {}",
                cluster.namespace
            )))
        }
        Some(ns) => Ok(ns),
        None => Ok(cluster.namespace.clone()),
    }
}

/// What the API server said when it refused the job.
fn refused(name: &str, namespace: &str) -> impl FnOnce(kube::Error) -> Error {
    let what = match namespace {
        "" => format!("creating {name}"),
        ns => format!("creating {name} in namespace {ns}"),
    };
    Error::api(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = include_str!("../../examples/copy.yaml");
    const EXAMPLE: &str = include_str!("../../examples/copy-dt.yaml");

    fn problems(text: &str, origin: &str, overrides: &Overrides) -> Vec<String> {
        match prepare(text, origin, Some("copy"), overrides, "ml") {
            Err(Error::Invalid { problems, .. }) => {
                problems.iter().map(ToString::to_string).collect()
            }
            Err(other) => panic!("{other}"),
            Ok(_) => Vec::new(),
        }
    }

    #[test]
    fn the_examples_pass_as_they_are() {
        let (dt, _) = prepare(EXAMPLE, "e", None, &Overrides::default(), "ml").unwrap();
        assert_eq!(dt.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(dt.spec.replicas, 2);
        let (dt, m) = prepare(CONFIG, "c", Some("copy"), &Overrides::default(), "ml").unwrap();
        assert_eq!(m.source, Source::TrainerConfig);
        assert_eq!(dt.metadata.name.as_deref(), Some("copy"));
        assert_eq!(dt.spec.trainer.unwrap().max_steps, 600);
    }

    #[test]
    fn a_trainer_config_s_problems_name_its_own_fields() {
        let typo = CONFIG.replace("maxSteps: 600", "maxSteps: 600\nlabelSmothing: 0.1");
        assert_eq!(
            problems(&typo, "c", &Overrides::default()),
            ["labelSmothing: unknown field (did you mean labelSmoothing?)"]
        );
        let semantic = CONFIG.replace("maxSteps: 600", "maxSteps: 0");
        let found = problems(&semantic, "c", &Overrides::default());
        assert!(
            found.iter().any(|p| p.starts_with("maxSteps: ")),
            "{found:?}"
        );
    }

    #[test]
    fn a_flag_s_problem_names_the_flag() {
        let overrides = Overrides {
            replicas: Some(0),
            ..Overrides::default()
        };
        assert_eq!(
            problems(EXAMPLE, "e", &overrides),
            ["spec.replicas (--replicas): must be at least 1, got 0"]
        );
    }

    #[test]
    fn the_crd_s_rules_are_checked_before_sending() {
        let overrides = Overrides {
            procs: Some(4),
            gpus: Some(2),
            ..Overrides::default()
        };
        let found = problems(EXAMPLE, "e", &overrides);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("procsPerReplica must not exceed spec.gpusPerReplica"),
            "{found:?}"
        );
        let long = Overrides {
            name: Some("n".repeat(60)),
            ..Overrides::default()
        };
        let found = problems(EXAMPLE, "e", &long);
        assert!(
            found.iter().any(|p| p.contains("metadata.name")),
            "{found:?}"
        );
    }

    #[test]
    fn a_name_is_required_and_the_api_version_must_be_the_crd_s() {
        let found = match prepare(CONFIG, "-", None, &Overrides::default(), "ml") {
            Err(Error::Invalid { problems, .. }) => problems,
            other => panic!("{other:?}"),
        };
        assert_eq!(found[0].path, "metadata.name (--name)");
        let old = EXAMPLE.replace("ferrotrain.dev/v1alpha1", "ferrotrain.dev/v1");
        let found = problems(&old, "e", &Overrides::default());
        assert_eq!(
            found,
            ["apiVersion: must be ferrotrain.dev/v1alpha1, got \"ferrotrain.dev/v1\""]
        );
    }
}
