"""The event contract: operations, attribute columns, LSN notations and the total-order sequence."""
