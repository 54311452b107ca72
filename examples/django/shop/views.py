import json

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .orders import place_order, place_order_atomically


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    if connection.vendor == "postgresql":
        order, job = place_order_atomically(body["email"], int(body["total_cents"]))
        return JsonResponse({"order": order.pk, "receipt_job": job.id}, status=201)
    order = place_order(body["email"], int(body["total_cents"]))
    return JsonResponse({"order": order.pk}, status=201)
