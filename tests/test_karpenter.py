"""Karpenter on the created clusters: its objects against the 1.14.1 CRDs (schema, unknown fields and the CEL
rules the API server runs), its chart values against the chart, the wiring between the controller, its IAM,
the interruption queue and the pools, and the controller's policy against the upstream getting-started one.

Expectations come from the stack files, templates/compat read as YAML and the reference data; never from the
planners' own functions (the IAM policy is the one exception: its ARNs are only known after apply, so the pure
function is called with stand-in ARNs and its output checked against independent rules).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import celpy
import celpy.celtypes
import jsonschema
import pytest
import yaml

from conftest import StackPlan, crd_schema, reference_file, schema_validate, unknown_fields, unknown_paths
from triarch.planners import karpenter

RELEASE = "kubernetes:helm.sh/v3:Release"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
EKS_STACKS = ("dev", "prod")
CRDS = {"NodePool": "karpenter.sh_nodepools.yaml", "EC2NodeClass": "karpenter.k8s.aws_ec2nodeclasses.yaml"}


def karpenter_objects(plan: StackPlan) -> list[dict[str, Any]]:
    return [o for o in plan.objects() if o["apiVersion"].startswith(("karpenter.sh/", "karpenter.k8s.aws/"))]


def schema_of(kind: str) -> dict[str, Any]:
    return crd_schema("karpenter-v1.14.1", "crds", CRDS[kind])


# --- CEL: the validation rules the API server runs ------------------------------------------------------------

def _find(text: Any, pattern: Any) -> celpy.celtypes.StringType:
    match = re.search(str(pattern), str(text))
    return celpy.celtypes.StringType(match.group(0) if match else "")


def _split(text: Any, separator: Any) -> celpy.celtypes.ListType:
    return celpy.celtypes.ListType([celpy.celtypes.StringType(p) for p in str(text).split(str(separator))])


CEL_FUNCTIONS = {"find": _find, "split": _split}
"""The Kubernetes CEL string extensions Karpenter's rules use beyond standard CEL."""
CEL = celpy.Environment()


def cel_failures(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Every x-kubernetes-validations rule (transition rules on oldSelf aside) that `value` breaks, walking the
    schema as the API server does: each rule sees the value at its node as `self`."""
    found = []
    for validation in schema.get("x-kubernetes-validations") or []:
        rule = validation["rule"]
        if "oldSelf" in rule:
            continue
        program = CEL.program(CEL.compile(rule), functions=CEL_FUNCTIONS)
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            found.append(f"{path or '<root>'}: {validation.get('message', rule)}")
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for key, child in value.items():
            if key in properties:
                found += cel_failures(child, properties[key], f"{path}.{key}" if path else key)
            elif isinstance(schema.get("additionalProperties"), dict):
                found += cel_failures(child, schema["additionalProperties"], f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += cel_failures(item, schema["items"], f"{path}[{i}]")
    return found


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_each_pool_is_one_node_pool_and_one_node_class(shipped: dict[str, StackPlan], stack: str) -> None:
    objects = karpenter_objects(shipped[stack])
    pools = sorted(g["name"] for g in shipped[stack].config["triarch:nodeGroups"])
    assert sorted(o["metadata"]["name"] for o in objects if o["kind"] == "NodePool") == pools
    assert sorted(o["metadata"]["name"] for o in objects if o["kind"] == "EC2NodeClass") == pools


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_karpenter_objects_validate_against_the_crds(shipped: dict[str, StackPlan], stack: str) -> None:
    for obj in karpenter_objects(shipped[stack]):
        schema = schema_of(obj["kind"])
        schema_validate(obj, schema)
        body = {k: v for k, v in obj.items() if k != "metadata"}
        assert unknown_fields(body, schema) == [], obj["metadata"]["name"]
        assert cel_failures(body, schema) == [], obj["metadata"]["name"]


def test_the_crd_checks_catch_what_the_api_server_would_refuse(shipped: dict[str, StackPlan]) -> None:
    """The three checks are not vacuous: a misspelt field, a restricted label and a second AMI term fail them."""
    [pool] = [o for o in karpenter_objects(shipped["prod"]) if o["kind"] == "NodePool" and
              o["metadata"]["name"] == "l4"]
    [node_class] = [o for o in karpenter_objects(shipped["prod"]) if o["kind"] == "EC2NodeClass" and
                    o["metadata"]["name"] == "l4"]
    pool_schema, class_schema = schema_of("NodePool"), schema_of("EC2NodeClass")

    typo = copy.deepcopy(pool)
    typo["spec"]["disruption"]["consolidateAfer"] = "5m"
    assert unknown_fields(typo, pool_schema) == ["spec.disruption.consolidateAfer"]

    restricted = copy.deepcopy(pool)
    restricted["spec"]["template"]["metadata"]["labels"]["karpenter.sh/pool"] = "l4"
    assert any("karpenter.sh" in f or "restricted" in f
               for f in cel_failures(restricted["spec"], pool_schema["properties"]["spec"], "spec")), restricted

    two_terms = copy.deepcopy(node_class)
    two_terms["spec"]["amiSelectorTerms"].append({"tags": {"Name": "my-ami"}})
    assert cel_failures(two_terms["spec"], class_schema["properties"]["spec"], "spec")

    bad_budget = copy.deepcopy(pool)
    bad_budget["spec"]["disruption"]["budgets"] = [{"nodes": "1", "schedule": "@daily"}]
    assert cel_failures(bad_budget["spec"], pool_schema["properties"]["spec"], "spec")
    with pytest.raises(jsonschema.ValidationError):
        broken = copy.deepcopy(node_class)
        broken["spec"]["metadataOptions"]["httpTokens"] = "sometimes"
        schema_validate(broken, class_schema)


# --- the controller, its chart and its AWS side ---------------------------------------------------------------

def releases(plan: StackPlan) -> dict[str, Any]:
    return {r.inputs["name"]: r for r in plan.of_type(RELEASE)}


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_controller_and_crd_charts_are_pinned_oci_releases(shipped: dict[str, StackPlan], stack: str) -> None:
    chart = yaml.safe_load(reference_file("karpenter-v1.14.1", "Chart.yaml").read_text(encoding="utf-8"))
    found = releases(shipped[stack])
    controller, crds = found["karpenter"], found["karpenter-crd"]
    assert controller.inputs["version"] == crds.inputs["version"] == str(chart["version"]) == "1.14.1"
    # An OCI chart is asked for by its whole address: Helm looks for an index.yaml under any repository URL.
    assert controller.inputs["chart"] == "oci://public.ecr.aws/karpenter/karpenter"
    assert crds.inputs["chart"] == "oci://public.ecr.aws/karpenter/karpenter-crd"
    assert "repositoryOpts" not in controller.inputs
    # The CRDs come from their own chart (templates/, upgraded with it); the controller's crds/ are skipped.
    assert controller.inputs["skipCrds"] is True
    assert "skipCrds" not in crds.inputs
    assert crds.urn in shipped[stack].dependencies[controller.urn]
    assert controller.inputs["namespace"] == crds.inputs["namespace"] == "kube-system"


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_controller_values_exist_in_the_chart(shipped: dict[str, StackPlan], stack: str) -> None:
    upstream = yaml.safe_load(reference_file("karpenter-v1.14.1", "values.yaml").read_text(encoding="utf-8"))
    values = releases(shipped[stack])["karpenter"].inputs["values"]
    # nodeSelector is a map of label names (the chart's default has one; ours adds the pool label).
    assert unknown_paths(values, upstream, free={"nodeSelector"}) == []
    assert unknown_paths({"settings": {"clusterNme": "x"}}, upstream, free={"nodeSelector"}) == [
        "settings.clusterNme"]
    cluster = shipped[stack].config["triarch:cluster"]["name"]
    assert values["settings"]["clusterName"] == cluster
    # The controller runs on the system nodes (the Ray head's), never on a GPU node it could remove.
    assert values["nodeSelector"] == {"triarch.dev/pool": "system"}
    assert "image" not in values.get("controller", {}), "the published chart stamps its own image and digest"


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_pod_identity_reaches_the_chart_service_account(shipped: dict[str, StackPlan], stack: str) -> None:
    plan = shipped[stack]
    controller = releases(plan)["karpenter"]
    values = controller.inputs["values"]
    [association] = [r for r in plan.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                     if r.name == "karpenter-controller"]
    assert association.inputs["namespace"] == controller.inputs["namespace"]
    assert association.inputs["serviceAccount"] == values["serviceAccount"]["name"]
    assert values["serviceAccount"]["create"] is True
    assert association.urn in plan.dependencies[controller.urn]
    [role] = [r for r in plan.of_type("aws:iam/role:Role") if r.name == "karpenter-controller"]
    [statement] = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    cluster = plan.config["triarch:cluster"]["name"]
    assert statement["Condition"]["StringEquals"] == {
        "aws:RequestTag/eks-cluster-name": cluster,
        "aws:RequestTag/kubernetes-namespace": "kube-system",
        "aws:RequestTag/kubernetes-service-account": values["serviceAccount"]["name"],
    }


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_interruption_queue_and_its_rules(shipped: dict[str, StackPlan], stack: str) -> None:
    plan = shipped[stack]
    values = releases(plan)["karpenter"].inputs["values"]
    [queue] = plan.of_type("aws:sqs/queue:Queue")
    assert queue.inputs["name"] == values["settings"]["interruptionQueue"]
    assert queue.inputs["sqsManagedSseEnabled"] is True
    assert queue.inputs["messageRetentionSeconds"] == 300
    upstream = yaml.safe_load(reference_file("karpenter-v1.14.1", "getting-started-cloudformation.yaml")
                              .read_text(encoding="utf-8").replace("!Sub", "").replace("!GetAtt", "")
                              .replace("!Ref", ""))
    expected = sorted(json.dumps(r["Properties"]["EventPattern"], sort_keys=True)
                      for r in upstream["Resources"].values() if r["Type"] == "AWS::Events::Rule")
    rules = plan.of_type("aws:cloudwatch/eventRule:EventRule")
    assert sorted(json.dumps(json.loads(r.inputs["eventPattern"]), sort_keys=True) for r in rules) == expected
    targets = plan.of_type("aws:cloudwatch/eventTarget:EventTarget")
    assert sorted(t.name for t in targets) == sorted(r.name for r in rules)


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_karpenter_nodes_have_their_own_role_profile_and_access_entry(shipped: dict[str, StackPlan],
                                                                      stack: str) -> None:
    plan = shipped[stack]
    # The only entry for nodes (the admins' entries are STANDARD): managed node groups get theirs from EKS.
    [entry] = [e for e in plan.of_type("aws:eks/accessEntry:AccessEntry") if e.inputs["type"] != "STANDARD"]
    assert entry.inputs["type"] == "EC2_LINUX"
    [profile] = plan.of_type("aws:iam/instanceProfile:InstanceProfile")
    cluster = plan.config["triarch:cluster"]["name"]
    for node_class in plan.objects("EC2NodeClass"):
        assert node_class["spec"]["instanceProfile"] == profile.inputs["name"]
        assert "role" not in node_class["spec"]  # Karpenter would then create profiles, needing IAM writes
    assert cluster in profile.inputs["name"]
    # The managed node groups' role is not the Karpenter nodes' role (EKS refuses a second entry for a role).
    node_roles = [r for r in plan.resources if r.type == "triarch:nodegroups:NodeRole"]
    assert len(node_roles) == 2


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_pools_wait_for_the_controller(shipped: dict[str, StackPlan], stack: str) -> None:
    """NodePools depend on the controller: created after it, and on destroy removed (their nodes drained and
    terminated by Karpenter) before it."""
    plan = shipped[stack]
    controller = releases(plan)["karpenter"]
    for resource in [*plan.of_type(NODE_POOL), *plan.of_type(NODE_CLASS)]:
        assert controller.urn in plan.dependencies[resource.urn], resource.name


# --- the controller's IAM policy -------------------------------------------------------------------------------

ARNS = {"cluster_arn": "arn:aws:eks:us-east-1:111122223333:cluster/llm-prod",
        "node_role_arn": "arn:aws:iam::111122223333:role/karpenter-nodes-role-1a2b3c",
        "queue_arn": "arn:aws:sqs:us-east-1:111122223333:llm-prod-karpenter",
        "instance_profile_arn": "arn:aws:iam::111122223333:instance-profile/llm-prod-karpenter-node"}
MUTATING = re.compile(r"^ec2:(RunInstances|CreateFleet|CreateLaunchTemplate|CreateTags|TerminateInstances|"
                      r"DeleteLaunchTemplate)$")


@pytest.fixture(scope="module")
def policy() -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = karpenter.controller_policy(cluster="llm-prod", region="us-east-1",
                                                                   **ARNS)["Statement"]
    return statements


def actions(statement: dict[str, Any]) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else list(action)


def resources(statement: dict[str, Any]) -> list[str]:
    resource = statement["Resource"]
    return [resource] if isinstance(resource, str) else list(resource)


def upstream_actions() -> set[str]:
    """Every action the getting-started template's controller policies grant (their documents are JSON strings
    under !Sub; the YAML tags are read as plain strings)."""
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node)
                                 if isinstance(node, yaml.ScalarNode) else None)
    path = reference_file("karpenter-v1.14.1", "getting-started-cloudformation.yaml")
    template = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)
    found: set[str] = set()
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::IAM::ManagedPolicy":
            continue
        for statement in json.loads(resource["Properties"]["PolicyDocument"])["Statement"]:
            found.update(actions(statement))
    return found


def test_policy_grants_only_actions_of_the_upstream_policy(policy: list[dict[str, Any]]) -> None:
    upstream = upstream_actions()
    ours = {a for s in policy for a in actions(s)}
    assert ours <= upstream, ours - upstream
    # What Triarch leaves out on purpose: it creates the instance profile itself, and uses no capacity
    # reservations, placement groups or zonal shift.
    assert upstream - ours == {
        "iam:CreateInstanceProfile", "iam:TagInstanceProfile", "iam:AddRoleToInstanceProfile",
        "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile", "ec2:DescribeCapacityReservations",
        "ec2:DescribePlacementGroups", "arc-zonal-shift:GetManagedResource"}


def test_policy_is_scoped_to_this_cluster(policy: list[dict[str, Any]]) -> None:
    assert all(s["Effect"] == "Allow" for s in policy)
    assert not [a for s in policy for a in actions(s) if a.endswith("*")]
    for statement in policy:
        if any(a.startswith(("ec2:RunInstances", "ec2:CreateFleet")) for a in actions(statement)) and all(
                ":image/" in r or ":snapshot/" in r or ":security-group/" in r or ":subnet/" in r
                for r in resources(statement)):
            continue  # what an instance is launched from carries no cluster tag
        if any(MUTATING.match(a) for a in actions(statement)):
            text = json.dumps(statement.get("Condition", {}))
            assert "kubernetes.io/cluster/llm-prod" in text, statement["Sid"]
            assert "karpenter.sh/nodepool" in text, statement["Sid"]
    by_action = {a: s for s in policy for a in actions(s)}
    assert resources(by_action["iam:PassRole"]) == [ARNS["node_role_arn"]]
    assert by_action["iam:PassRole"]["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    assert resources(by_action["sqs:ReceiveMessage"]) == [ARNS["queue_arn"]]
    assert resources(by_action["eks:DescribeCluster"]) == [ARNS["cluster_arn"]]
    assert resources(by_action["iam:GetInstanceProfile"]) == [ARNS["instance_profile_arn"]]
    described = by_action["ec2:DescribeInstances"]
    assert described["Condition"] == {"StringEquals": {"aws:RequestedRegion": "us-east-1"}}


def test_policy_arns_follow_the_region_partition() -> None:
    statements = karpenter.controller_policy(cluster="c", region="cn-north-1", **ARNS)["Statement"]
    arns = [r for s in statements for r in resources(s) if r.startswith("arn:") and r not in ARNS.values()]
    assert arns and all(r.startswith("arn:aws-cn:") for r in arns), arns


def test_queue_accepts_events_only_over_tls() -> None:
    document = karpenter.queue_policy(ARNS["queue_arn"])
    allow, deny = document["Statement"]
    assert allow["Principal"] == {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]}
    assert allow["Action"] == "sqs:SendMessage"
    assert (deny["Effect"], deny["Condition"]) == ("Deny", {"Bool": {"aws:SecureTransport": "false"}})
