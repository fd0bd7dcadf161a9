"""The znode layout (docs/metastore.md): every path Millrace uses in ZooKeeper, defined once."""

from __future__ import annotations

ROOT = "/millrace"
ELECTION_PATH = f"{ROOT}/conductor/election"
NODES_PATH = f"{ROOT}/nodes"
MODULES_PATH = f"{ROOT}/modules"
DISALLOWED_PATH = f"{ROOT}/disallowed"


def module_path(module: str) -> str:
    return f"{MODULES_PATH}/{module}"


def group_path(module: str, group: int) -> str:
    return f"{MODULES_PATH}/{module}/groups/{group}"


def resign_path(module: str, group: int) -> str:
    return f"{MODULES_PATH}/{module}/resign/{group}"


def version_path(module: str, sha256: str) -> str:
    return f"{MODULES_PATH}/{module}/versions/{sha256}"

SECURITY_PATH = f"{ROOT}/security"
ACLS_PATH = f"{SECURITY_PATH}/acls"  #: one znode: every module's ACL (conductor.security.acl.Acls JSON)
TOKENS_PATH = f"{SECURITY_PATH}/tokens"  #: <token-id> -> TokenRecord JSON (a hash, never a token)

PLANS_PATH = f"{ROOT}/plans"  #: <module> -> its reassignment plan (conductor.metastore.plans.ReassignmentPlan JSON)


def plan_path(module: str) -> str:
    return f"{PLANS_PATH}/{module}"
