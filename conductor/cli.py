"""The `conductor` command line: the operator's way into a Millrace cluster."""

from __future__ import annotations

import logging

import typer
from rich.console import Console

app = typer.Typer(
    help="Millrace conductor: deploy modules, inspect task groups, check this machine.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="log debug detail to stderr")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command()
def doctor() -> None:
    """Check Java, ZooKeeper, RocksDB, gRPC and Spark+Delta by doing real work with each."""
    from conductor.doctor import CheckResult, run_checks

    console.print("[bold]Millrace doctor[/bold]: checking every component with a real round trip")

    def show(r: CheckResult) -> None:
        mark = "[green]✔[/green]" if r.ok else "[red]✘[/red]"
        console.print(f" {mark} [bold]{r.component:<12}[/bold] {r.detail} [dim]({r.seconds:.1f}s)[/dim]")

    results = run_checks(show)
    failed = [r for r in results if not r.ok]
    if failed:
        console.print(f"[red]{len(failed)} check(s) failed[/red]: run `make setup`, then `conductor doctor -v`")
        raise typer.Exit(1)
    console.print(f"[green]all {len(results)} checks passed[/green]")


if __name__ == "__main__":
    app()
