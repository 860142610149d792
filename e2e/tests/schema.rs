//! The API server refuses bad objects at `kubectl apply`, naming the field (server-side dry
//! run against the installed CRD: structural schema, ranges, enums and CEL rules).

use ferrotrain_api::crd::DistributedTraining;
use ferrotrain_e2e::TestNamespace;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

#[tokio::test]
#[ignore = "needs a cluster with the operator installed (e2e/kind.sh)"]
async fn the_api_server_rejects_invalid_objects_naming_the_field() {
    let ns = TestNamespace::create("crd").await;
    {
        let resource = ApiResource::erase::<DistributedTraining>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &resource);
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let good = json!({
            "replicas": 2,
            "trainer": {"task": "copy", "maxSteps": 10, "model": {"dModel": 64, "heads": 4}}
        });
        let object = |spec: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "ferrotrain.dev/v1alpha1",
                "kind": "DistributedTraining",
                "metadata": {"name": "bad"},
                "spec": spec,
            }))
            .unwrap()
        };
        api.create(&dry_run, &object(good.clone()))
            .await
            .expect("a valid object is accepted");

        let with = |pointer: &str, value: Value| {
            let mut spec = good.clone();
            *spec
                .pointer_mut(pointer)
                .unwrap_or_else(|| panic!("{pointer}")) = value;
            spec
        };
        let mut bad_model = good.clone();
        bad_model["trainer"]["model"] = json!({"dModel": 250, "heads": 4});
        let mut negative_restarts = good.clone();
        negative_restarts["restartPolicy"] = json!({"maxRestarts": -1});
        let mut elastic_below = good.clone();
        elastic_below["elastic"] = json!({"minReplicas": 1, "maxReplicas": 1});
        let mut two_checkpoint_volumes = good.clone();
        two_checkpoint_volumes["checkpoint"] = json!({"claimName": "a", "volumeName": "b"});
        let cases = [
            ("replicas 0", with("/replicas", json!(0)), "spec.replicas"),
            (
                "unknown task",
                with("/trainer/task", json!("summarize")),
                "spec.trainer.task",
            ),
            (
                "negative maxRestarts",
                negative_restarts,
                "spec.restartPolicy.maxRestarts",
            ),
            (
                "dModel % heads",
                bad_model,
                "model.dModel must be divisible by model.heads",
            ),
            (
                "maxReplicas below replicas",
                elastic_below,
                "spec.elastic.maxReplicas must be at least spec.replicas",
            ),
            (
                "claimName and volumeName",
                two_checkpoint_volumes,
                "set at most one of spec.checkpoint.claimName and spec.checkpoint.volumeName",
            ),
        ];
        for (what, spec, needle) in cases {
            match api.create(&dry_run, &object(spec)).await {
                Ok(_) => panic!("{what}: accepted"),
                Err(kube::Error::Api(status)) => {
                    assert_eq!(status.code, 422, "{what}: {status:?}");
                    assert!(
                        status.message.contains(needle),
                        "{what}: message does not name {needle:?}: {}",
                        status.message
                    );
                }
                Err(e) => panic!("{what}: {e}"),
            }
        }
    }
}
