"""Why a run is as fast as it is: one verdict per rank from its step records (``classify``),
and the one rule for which steps and caps a run is judged on (``judge``), so the summary,
the live store and the app agree. Pure: no Ray, no torch."""
