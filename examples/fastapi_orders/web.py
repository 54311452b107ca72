"""FastAPI: place an order and queue its receipt inside the request's PostgreSQL transaction.

From the ``examples/`` directory (``pip install 'conveyor[postgres,examples]' uvicorn``)::

    export DATABASE_URL=postgresql://localhost/shop
    uvicorn fastapi_orders.web:api                          # the web app
    conveyor --app fastapi_orders.jobs:app worker           # a worker, in another terminal

    curl -X POST localhost:8000/products -H 'content-type: application/json' \\
         -d '{"sku": "mug", "price_cents": 1200, "in_stock": 10}'
    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"email": "ada@example.com", "lines": [{"sku": "mug", "quantity": 2}]}'
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

from . import jobs

SCHEMA = """
CREATE TABLE IF NOT EXISTS products (
    sku         text PRIMARY KEY,
    price_cents int  NOT NULL CHECK (price_cents >= 0),
    in_stock    int  NOT NULL CHECK (in_stock >= 0)
);
CREATE TABLE IF NOT EXISTS orders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email       text   NOT NULL,
    total_cents int    NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS order_lines (
    order_id bigint NOT NULL REFERENCES orders,
    sku      text   NOT NULL REFERENCES products,
    quantity int    NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, sku)
);
CREATE TABLE IF NOT EXISTS receipts (
    order_id    bigint PRIMARY KEY REFERENCES orders,
    total_cents int    NOT NULL,
    issued_at   timestamptz NOT NULL DEFAULT now()
);
"""


class Product(BaseModel):
    sku: str
    price_cents: int = Field(ge=0)
    in_stock: int = Field(ge=0)


class Line(BaseModel):
    sku: str
    quantity: int = Field(gt=0)


class OrderIn(BaseModel):
    email: str
    lines: list[Line] = Field(min_length=1)


class OrderOut(BaseModel):
    order_id: int
    total_cents: int
    receipt_job_id: int


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    pool = AsyncConnectionPool(jobs.DATABASE_URL, open=False)
    await pool.open()
    try:
        async with pool.connection() as conn:
            await conn.execute(SCHEMA)
        # Open Conveyor's store (and create its tables) now, off the event loop, rather
        # than inside the first request.
        await asyncio.to_thread(lambda: jobs.app.backend)
        api.state.pool = pool
        yield
    finally:
        await pool.close()


api = FastAPI(title="Conveyor example: orders", lifespan=lifespan)


def _pool(request: Request) -> AsyncConnectionPool[Any]:
    pool: AsyncConnectionPool[Any] = request.app.state.pool
    return pool


@api.post("/products", status_code=201)
async def add_product(product: Product, request: Request) -> Product:
    async with _pool(request).connection() as conn:
        await conn.execute(
            "INSERT INTO products (sku, price_cents, in_stock) VALUES (%s, %s, %s)"
            " ON CONFLICT (sku) DO UPDATE SET price_cents = excluded.price_cents, in_stock = excluded.in_stock",
            (product.sku, product.price_cents, product.in_stock),
        )
    return product


@api.post("/orders", status_code=201)
async def place_order(order: OrderIn, request: Request) -> OrderOut:
    async with _pool(request).connection() as conn, conn.transaction():
        cur = await conn.execute("INSERT INTO orders (email) VALUES (%s) RETURNING id", (order.email,))
        row = await cur.fetchone()
        assert row is not None
        order_id: int = row[0]

        # The job is written in this transaction: nobody sees it before the commit, and
        # if anything below fails, the order, its lines and the job vanish together.
        # Where in the transaction you enqueue makes no difference.
        job = await jobs.issue_receipt.aenqueue(order_id, connection=conn)

        total = 0
        for line in order.lines:
            cur = await conn.execute(
                "UPDATE products SET in_stock = in_stock - %s WHERE sku = %s AND in_stock >= %s"
                " RETURNING price_cents",
                (line.quantity, line.sku, line.quantity),
            )
            product = await cur.fetchone()
            if product is None:
                # Leaving the block with an exception rolls everything back, the job included.
                raise HTTPException(409, f"not enough {line.sku!r} in stock")
            await conn.execute(
                "INSERT INTO order_lines (order_id, sku, quantity) VALUES (%s, %s, %s)",
                (order_id, line.sku, line.quantity),
            )
            total += product[0] * line.quantity
        await conn.execute("UPDATE orders SET total_cents = %s WHERE id = %s", (total, order_id))
    # Committed: the order exists and exactly one receipt job is waiting for a worker.
    return OrderOut(order_id=order_id, total_cents=total, receipt_job_id=job.id)


@api.get("/orders/{order_id}")
async def get_order(order_id: int, request: Request) -> dict[str, Any]:
    async with _pool(request).connection() as conn:
        cur = await conn.execute(
            "SELECT o.total_cents, r.issued_at FROM orders o LEFT JOIN receipts r ON r.order_id = o.id"
            " WHERE o.id = %s",
            (order_id,),
        )
        row = await cur.fetchone()
    if row is None:
        raise HTTPException(404, f"no order {order_id}")
    total_cents, issued_at = row
    return {"order_id": order_id, "total_cents": total_cents, "receipt_issued": issued_at is not None}
