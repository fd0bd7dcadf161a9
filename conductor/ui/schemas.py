"""JSON Schemas (2020-12, as OpenAPI 3.1 uses) of the API's documents, for ``/openapi.json``.

They name every field a page shows, with its type, so a script knows what it gets without reading a page;
fields the status documents carry beyond these are allowed (``additionalProperties`` is left open), since
``conductor.status`` may add more. ``tests/unit/test_ui.py`` and ``tests/integration/test_ui.py`` check real
documents against them.
"""

from __future__ import annotations

from typing import Any


def _obj(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    return {"type": "object", "required": sorted(required), "properties": {**required, **optional}}


def _arr(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


STR: dict[str, Any] = {"type": "string"}
INT: dict[str, Any] = {"type": "integer"}
NUM: dict[str, Any] = {"type": "number"}
BOOL: dict[str, Any] = {"type": "boolean"}
NULLABLE_STR: dict[str, Any] = {"type": ["string", "null"]}
NULLABLE_INT: dict[str, Any] = {"type": ["integer", "null"]}
NAMES = _arr(STR)

NODE = _obj({"node": STR, "address": STR, "replication": STR, "metrics": STR, "pid": INT, "started": NUM,
             "leaders_allowed": BOOL}, version=NULLABLE_STR, token=NULLABLE_STR, secure=BOOL)
MODULE_ROW = _obj({"module": STR, "module_ref": STR, "tasks": INT, "group_count": INT, "replication_factor": INT,
                   "workers": INT, "min_isr": INT, "options": {"type": "object"}, "groups_led": INT,
                   "groups_total": INT, "state": STR})
STATUS = _obj({"zk": STR, "nodes": _arr(NODE), "modules": _arr(MODULE_ROW)})

REPLICA = {"type": ["object", "null"], "required": ["reachable"], "properties": {
    "reachable": BOOL, "error": NULLABLE_STR, "role": STR, "epoch": INT, "log_start": INT, "log_end": INT,
    "apply_offset": INT, "applied_offset": INT, "dead_letters": INT, "code_version": STR,
    "depots": _arr(_obj({"depot": STR, "task": INT, "start": INT, "end": INT, "records": INT, "bytes": INT})),
    "follower_offsets": {"type": "object", "additionalProperties": INT}}}
FOLLOWER = _obj({"node": STR, "in_isr": BOOL, "live": BOOL, "offset": NULLABLE_INT, "lag": NULLABLE_INT})
CATCHUP = _obj({"node": STR, "leader": STR, "round": INT, "bytes_done": INT, "bytes_total": INT,
                "bytes_per_s": NUM, "state": STR})
GROUP = _obj({"group": INT, "tasks": _arr(INT), "leader": NULLABLE_STR, "leader_address": NULLABLE_STR,
              "epoch": INT, "isr": NAMES, "osr": NAMES, "elr": NAMES, "replicas": NAMES,
              "leaderless_reason": NULLABLE_STR, "replica": REPLICA, "followers": _arr(FOLLOWER),
              "serving": BOOL, "problem": NULLABLE_STR, "catchups": _arr(CATCHUP),
              "faults": _arr(_obj({"node": STR, "fault": STR})), "handing_off_to": NULLABLE_STR})
PARTITION = _obj({"task": INT, "start": INT, "end": INT})
DEPOT = _obj({"depot": STR, "partitions": _arr(PARTITION), "records": INT, "start": INT, "end": INT, "bytes": INT,
              "groups_reporting": INT})
MODULE = _obj({"module": STR, "module_ref": STR, "tasks": INT, "group_count": INT, "replication_factor": INT,
               "workers": INT, "min_isr": INT, "options": {"type": "object"}, "effective_options": {"type": "object"},
               "code": _obj({"version": STR, "switching": _arr(INT), "migrations": {"type": "object"}}),
               "live_nodes": NAMES, "groups": _arr(GROUP), "serving": INT, "checked_at": NUM, "state": STR,
               "disallowed_leaders": NAMES}, depots=_arr(DEPOT))

SERIES = _obj({"name": STR, "legend": STR, "points": _arr({"type": "array", "prefixItems": [NUM, NUM]})})
TELEMETRY = _obj({"module": STR, "node": NULLABLE_STR, "role": STR, "type": STR, "types": NAMES, "interval_s": NUM, "history_s": NUM, "series_kept": INT,
                  "series_refused": INT,
                  "charts": _arr(_obj({"id": STR, "title": STR, "unit": STR, "series": _arr(SERIES)}))})
WORKERS = _obj({"conductor": _obj({"name": STR, "active": BOOL}),
                "scrapes": {"type": "object", "additionalProperties": _obj(
                    {"address": STR, "at": NUM, "error": NULLABLE_STR, "samples": INT})}})
CHANGE = _obj({"at": NUM, "module": STR, "group": INT, "from": NULLABLE_STR, "to": NULLABLE_STR, "epoch": INT,
               "isr": {"type": ["array", "null"], "items": STR}, "reason": STR})
LEADERSHIP = _obj({"changes": _arr(CHANGE), "leaderless": _arr(_obj({"module": STR, "group": INT, "seconds": NUM}))})
OPENAPI = _obj({"openapi": STR, "info": {"type": "object"}, "paths": {"type": "object"}},
               components={"type": "object"})

#: the documents by the name ``/openapi.json`` gives them under ``components.schemas``
SCHEMAS: dict[str, dict[str, Any]] = {"Status": STATUS, "Module": MODULE, "Telemetry": TELEMETRY,
                                      "Workers": WORKERS, "Leadership": LEADERSHIP, "OpenAPI": OPENAPI}
