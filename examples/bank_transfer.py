"""Bank transfers as a Spark microbatch topology: money is never created or destroyed.

Deposits and transfers are appended to depots; a microbatch turns each batch
into balance changes (`add`), committed to every task group exactly once, so a
Spark driver killed at any point and restarted from its checkpoint neither
double-applies nor loses a transfer: the sum of balances always equals the sum
of deposits.
"""

from pstate import Map
from topology import Module, hash_by


def by_account(tx: dict) -> str:
    return tx.get("from") or tx["account"]


class BankTransfer(Module):
    def define(self, m):
        deposits = m.depot("*deposits", hash_by(by_account))
        transfers = m.depot("*transfers", hash_by(by_account))
        m.pstate("$$balances", Map(str, int))

        @m.microbatch(deposits, transfers)
        def ledger(batch, ctx):
            from pyspark.sql import functions as F

            tx = batch.select(
                F.get_json_object("value", "$.account").alias("account"),
                F.get_json_object("value", "$.from").alias("src"),
                F.get_json_object("value", "$.to").alias("dst"),
                F.get_json_object("value", "$.amount").cast("long").alias("amount"),
            )
            deposits = tx.where("account IS NOT NULL").select(F.col("account").alias("key"), "amount")
            debits = tx.where("src IS NOT NULL").select(F.col("src").alias("key"), (-F.col("amount")).alias("amount"))
            credits = tx.where("dst IS NOT NULL").select(F.col("dst").alias("key"), "amount")
            net = deposits.unionByName(debits).unionByName(credits).groupBy("key").agg(F.sum("amount").alias("value"))
            return net.select(F.lit("$$balances").alias("target"), "key", F.lit("add").alias("op"), "value")
