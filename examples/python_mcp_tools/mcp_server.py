"""The MCP server of examples/grpo_python_mcp_tools.yaml, over stdio, written with the `mcp` package
(FastMCP). It needs a Python with `mcp` installed: tools.yaml starts it with the project's venv
(../../.venv/bin/python, which scripts/setup.sh makes); point `command` at another such Python if yours
lives elsewhere."""
from mcp.server.fastmcp import FastMCP

from stock_table import stock_table

server = FastMCP("warehouse")
STOCK = stock_table()


@server.tool()
def stock(item: str) -> int:
    """How many units of an item (a code such as K17) the warehouse holds."""
    code = item.strip().upper()
    if code not in STOCK:
        raise ValueError(f"unknown item {item!r}: codes are a letter and two digits, such as K17")
    return STOCK[code]


if __name__ == "__main__":
    server.run()
