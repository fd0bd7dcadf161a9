"""Timelines: who follows whom, posts, and a fanout hop that delivers each post to every follower's timeline.

    conductor deploy --module examples.timeline:Timeline --tasks 8 --threads 4 --workers 3 --replicationFactor 3

The shape of Rama's Mastodon showcase. A post runs on its author's task, where
the author's followers are (both depots are partitioned by author), and hops
to each follower's task to write that follower's timeline: a read here, a
write there. ``ack="applied"`` on a post returns once every follower's
timeline holds it, on whichever task groups they live. The query topology
``timeline_page`` joins a follower's latest timeline entries (on the
follower's task) with each author's follower count (on the author's task):
``cluster.query("Timeline", "timeline_page", "bob", 20)``.
"""

from pstate import Map, P, Set
from topology import Module, hash_by
from topology.combiners import merge


def by_author(r: dict) -> str:
    return r["author"]


def plus_one(n: int | None) -> int:
    return (n or 0) + 1


class Timeline(Module):
    def define(self, m):
        follows = m.depot("*follows", hash_by(by_author))  # {"author": "ann", "follower": "bob"}
        posts = m.depot("*posts", hash_by(by_author))  # {"author": "ann", "id": 17, "text": "..."}
        m.pstate("$$followers", Map(str, Set(str).subindexed()))  # author -> followers, on the author's task
        m.pstate("$$timelines", Map(str, Map(int, str).subindexed()))  # follower -> post id -> author
        m.pstate("$$unread", Map(str, int))  # follower -> posts delivered (a counter: exactly once matters)

        @m.stream(follows)
        def follow(ctx, f: dict):
            ctx.transform("$$followers", f["author"], P.add(f["follower"]))

        @m.stream(posts)
        def fanout(ctx, post: dict):
            followers = ctx.select("$$followers", post["author"], P.all())  # local: the post's own task
            for follower in followers:
                ctx.send(deliver, follower, post["id"], post["author"])  # a hop to the follower's task
            return len(followers)  # the append's ack value

        @m.query("timeline_page", combine=merge)
        def timeline_page(q, user: str, n: int):
            """On `user`'s task: the last `n` posts of their timeline, each joined where its author lives."""
            for post_id, author in q.select("$$timelines", user, P.last(n).all()):
                q.send(post_author, author, post_id)

        @m.query("post_author", combine=merge)
        def post_author(q, author: str, post_id: int):
            """On `author`'s task (a hop): the post's author and how many followers they have now."""
            return {post_id: {"author": author, "followers": q.select_one("$$followers", author, P.count())}}

        @m.handler
        def deliver(ctx, follower: str, post_id: int, author: str):
            ctx.transform("$$timelines", follower, P.key(post_id).set(author))  # all on the follower's task
            ctx.update("$$unread", follower, plus_one)
