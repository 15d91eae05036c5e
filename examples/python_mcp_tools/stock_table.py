"""The warehouse's stock, known only to the MCP server (mcp_server.py) and the data writer (make_data.py):
the model cannot guess a count, it must ask the `stock` tool."""
import random


def stock_table():
    rng = random.Random(7)
    codes = [f"{letter}{number:02d}" for letter in "ABCDEFGHJKLMNPQRSTUVWXYZ" for number in range(100)]
    return {code: rng.randint(1, 999) for code in codes}
