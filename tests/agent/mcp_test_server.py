# An MCP server over stdio for tests/agent/test_mcp_tool.cpp, written with the `mcp` package (FastMCP).
import os
import sys
import time

from mcp.server.fastmcp import FastMCP

server = FastMCP("hybridflow-test")
CAPITALS = {"france": "Paris", "japan": "Tokyo", "peru": "Lima"}


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def capital(country: str) -> str:
    """The capital city of a country."""
    if country.lower() not in CAPITALS:
        raise ValueError(f"no capital known for {country}")
    return CAPITALS[country.lower()]


@server.tool()
def nap(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "awake"


@server.tool()
def die() -> str:
    """Exit the server process without answering."""
    sys.stderr.write("test server exiting on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
def blob(size: int) -> str:
    """A string of `size` characters."""
    return "x" * size


if __name__ == "__main__":
    server.run("stdio")
