"""Site configs and job specs (pydantic models) and their loading."""

from hpctrain.config.job import JobSpec, load_job_spec
from hpctrain.config.site import SiteConfig, load_site

__all__ = ["JobSpec", "SiteConfig", "load_job_spec", "load_site"]
