"""Millrace's public module API: declare depots, PStates and topologies in Python."""

from topology.module import Migration, Module, ModuleDefinition, ModuleDefinitionError, load_module
from topology.partitioners import Partitioner, custom, global_, hash_by, random, task_for_key

__all__ = [
    "Migration",
    "Module",
    "ModuleDefinition",
    "ModuleDefinitionError",
    "Partitioner",
    "custom",
    "global_",
    "hash_by",
    "load_module",
    "random",
    "task_for_key",
]
