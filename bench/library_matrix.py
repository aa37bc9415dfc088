"""The library matrix: a cell for each popular library, run twice on one warm kernel.

A cell imports its library the way notebooks do, uses it (a fit, a plot, a query, a
progress bar, a display), and binds ``warm`` to the id of the library's module and ``pid``
to the kernel's process id. Run twice on a one-kernel pool, both must match: the kernel
was reset and kept, not retired, and the second import found the module already loaded.
The test suite asserts it for every library (``tests/worker/test_library_matrix.py``); the
benchmark counts retirements and times the second run per library (``--cases libraries``).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

_TAIL = "\npid = __import__('os').getpid()\n"


@dataclass(frozen=True)
class Library:
    name: str
    module: str  # what must be importable for the case to run
    source: str  # the cell; binds ``warm`` (and ``pid``, added by :attr:`cell`)

    @property
    def cell(self) -> str:
        return self.source + _TAIL

    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None


LIBRARIES = (
    Library(
        "numpy", "numpy", "import numpy as np\ntotal = float(np.arange(10).sum())\nwarm = id(np)"
    ),
    Library(
        "pandas",
        "pandas",
        "import pandas as pd\nsummary = pd.DataFrame({'a': [1, 2, 3]}).describe().to_dict()\n"
        "warm = id(pd)",
    ),
    Library(
        "matplotlib-agg",
        "matplotlib",
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\nax.plot([1, 2, 3])\nfig.savefig(__import__('io').BytesIO())\n"
        "warm = id(plt)\ndel fig, ax",
    ),
    Library(
        "matplotlib-pyplot",
        "matplotlib",
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title('line')\nplt.show()\n"
        "warm = id(plt)",
    ),
    Library(
        "scipy",
        "scipy",
        "import scipy.optimize, scipy.stats\n"
        "best = float(scipy.optimize.minimize_scalar(lambda x: (x - 1) ** 2).x)\n"
        "p = float(scipy.stats.norm.cdf(0))\nwarm = id(scipy.optimize)",
    ),
    Library(
        "scikit-learn",
        "sklearn",
        "import numpy as np\nimport sklearn\nfrom sklearn.ensemble import RandomForestClassifier\n"
        "from sklearn.model_selection import cross_val_score\n"
        "X, y = np.random.rand(40, 3), np.arange(40) % 2\n"
        "scores = cross_val_score(RandomForestClassifier(n_estimators=5), X, y, cv=2, n_jobs=2)\n"
        "score = float(scores.mean())\nwarm = id(sklearn)\ndel X, y, scores",
    ),
    Library(
        "seaborn",
        "seaborn",
        "import pandas as pd\nimport seaborn as sns\nsns.set_theme()\n"
        "sns.histplot(pd.DataFrame({'a': [1, 2, 2, 3]}), x='a')\nwarm = id(sns)",
    ),
    Library(
        "polars",
        "polars",
        "import polars as pl\n"
        "counts = pl.DataFrame({'a': [1, 1, 2]}).group_by('a').len().sort('a').to_dicts()\n"
        "warm = id(pl)",
    ),
    Library(
        "duckdb",
        "duckdb",
        "import duckdb\nanswer = duckdb.sql('select 40 + 2').fetchall()[0][0]\n"
        "con = duckdb.connect()\ncon.execute('create table t (a int)')\ncon.close()\n"
        "warm = id(duckdb)\ndel con",
    ),
    Library(
        "plotly",
        "plotly",
        "import plotly.express as px\nfig = px.line(x=[1, 2, 3], y=[3, 1, 2])\nfig.show()\n"
        "warm = id(px)\ndel fig",
    ),
    Library(
        "altair",
        "altair",
        "import altair as alt\nimport pandas as pd\n"
        "chart = alt.Chart(pd.DataFrame({'a': [1, 2]})).mark_point().encode(x='a')\n"
        "spec = chart.to_dict()\ndisplay(chart)\nwarm = id(alt)\ndel chart",
    ),
    Library(
        "sympy",
        "sympy",
        "import sympy\nx = sympy.symbols('x')\nintegral = str(sympy.integrate(x**2, x))\n"
        "display(sympy.sqrt(8))\nwarm = id(sympy)\ndel x",
    ),
    Library(
        "statsmodels",
        "statsmodels",
        "import numpy as np\nimport statsmodels.api as sm\n"
        "fit = sm.OLS(np.arange(10.0), sm.add_constant(np.arange(10.0))).fit()\n"
        "slope = float(fit.params[1])\nwarm = id(sm)\ndel fit",
    ),
    Library(
        "pillow",
        "PIL",
        "import PIL\nfrom PIL import Image, ImageDraw\nimage = Image.new('RGB', (16, 16))\n"
        "ImageDraw.Draw(image).line((0, 0, 15, 15))\ndisplay(image)\nwarm = id(PIL)\ndel image",
    ),
    Library(
        "requests",
        "requests",
        "import requests\nsession = requests.Session()\n"
        "prepared = session.prepare_request(requests.Request('GET', 'http://127.0.0.1/x')).url\n"
        "session.close()\nwarm = id(requests)\ndel session",
    ),
    Library(
        "sqlalchemy",
        "sqlalchemy",
        "import sqlalchemy as sa\nengine = sa.create_engine('sqlite://')\n"
        "with engine.connect() as connection:\n"
        "    one = connection.execute(sa.text('select 1')).scalar()\n"
        "engine.dispose()\nwarm = id(sa)\ndel engine, connection",
    ),
    Library(
        "tqdm",
        "tqdm",
        "import tqdm\nfrom tqdm import tqdm as progress\n"
        "steps = sum(1 for _ in progress(range(200), mininterval=0))\nwarm = id(tqdm)",
    ),
    Library(
        "tqdm.auto",
        "tqdm",
        "import time\nimport tqdm.auto as auto\nfrom tqdm.auto import tqdm\n"
        "for _ in tqdm(range(20)):\n    time.sleep(0.001)\nwarm = id(auto)\ndel _",
    ),
    Library(
        "networkx",
        "networkx",
        "import networkx as nx\npath = nx.shortest_path(nx.path_graph(5), 0, 4)\nwarm = id(nx)",
    ),
    Library(
        "bokeh",
        "bokeh",
        "import bokeh\nfrom bokeh.io import output_notebook\nfrom bokeh.plotting import figure, show\n"
        "output_notebook(hide_banner=True)\nplot = figure()\nplot.line([1, 2], [3, 4])\nshow(plot)\n"
        "warm = id(bokeh)\ndel plot",
    ),
    Library(
        "xarray",
        "xarray",
        "import numpy as np\nimport xarray as xr\n"
        "means = xr.DataArray(np.arange(6).reshape(2, 3), dims=('x', 'y')).mean('x').values.tolist()\n"
        "warm = id(xr)",
    ),
    Library(
        "ipywidgets",
        "ipywidgets",
        "import ipywidgets as widgets\nslider = widgets.IntSlider(value=3)\ndisplay(slider)\n"
        "value = slider.value\nwarm = id(widgets)\ndel slider",
    ),
    Library(
        "dask",
        "dask",
        "import dask\nimport dask.array as da\n"
        "total = float(da.ones((100, 100), chunks=10).sum().compute())\nwarm = id(dask)",
    ),
    Library(
        "joblib",
        "joblib",
        "import joblib\nfrom joblib import Parallel, delayed\n"
        "squares = Parallel(n_jobs=2)(delayed(pow)(i, 2) for i in range(4))\nwarm = id(joblib)",
    ),
)
