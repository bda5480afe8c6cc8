//! Where an operation's connection comes from: the ledger's own connection,
//! made again when it breaks, the application's client, or a checkout of
//! the application's pool. Apart so that the operations see one thing, a
//! connection lent for one operation, whatever its source.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_postgres::Client;

use super::failure::Failure;

pub(super) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where an operation's connection comes from.
pub(super) enum Source {
    /// The ledger's own connection, made again when it is found broken.
    Own(Own),
    /// The application's client, used as it is.
    Given(Arc<Client>),
    /// The application's pool: one checkout per operation.
    Pool(Box<dyn Pool>),
}

type Connect =
    Box<dyn Fn() -> BoxFuture<'static, Result<Client, tokio_postgres::Error>> + Send + Sync>;

pub(super) struct Own {
    pub(super) connect: Connect,
    pub(super) current: Mutex<Option<Arc<Client>>>,
    /// One reconnection at a time: the others wait for it, then share it.
    pub(super) connecting: tokio::sync::Mutex<()>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is one assignment or clone.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Own {
    fn live(&self) -> Option<Arc<Client>> {
        lock(&self.current).as_ref().filter(|client| !client.is_closed()).cloned()
    }

    pub(super) async fn client(&self) -> Result<Arc<Client>, Failure> {
        if let Some(client) = self.live() {
            return Ok(client);
        }
        let _one = self.connecting.lock().await;
        if let Some(client) = self.live() {
            return Ok(client);
        }
        let client = Arc::new((self.connect)().await.map_err(Failure::Pg)?);
        *lock(&self.current) = Some(Arc::clone(&client));
        Ok(client)
    }

    /// The next operation connects anew, unless another already did.
    pub(super) fn discard(&self, client: &Arc<Client>) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            *current = None;
        }
    }
}

/// A connection lent to one operation.
pub(super) enum Lent {
    Shared(Arc<Client>),
    Pooled(Box<dyn PooledClient>),
}

impl Lent {
    pub(super) fn client(&self) -> &Client {
        match self {
            Lent::Shared(client) => client,
            Lent::Pooled(pooled) => pooled.client(),
        }
    }

    pub(super) fn shared(&self) -> Option<&Arc<Client>> {
        match self {
            Lent::Shared(client) => Some(client),
            Lent::Pooled(_) => None,
        }
    }
}

pub(super) trait PooledClient: Send {
    fn client(&self) -> &Client;
}

struct Projected<C> {
    checked_out: C,
    client: fn(&C) -> &Client,
}

impl<C: Send> PooledClient for Projected<C> {
    fn client(&self) -> &Client {
        (self.client)(&self.checked_out)
    }
}

pub(super) trait Pool: Send + Sync {
    fn get(&self) -> BoxFuture<'_, Result<Lent, String>>;
}

pub(super) struct FnPool<F, C> {
    pub(super) get: F,
    pub(super) client: fn(&C) -> &Client,
}

impl<F, Fut, C, E> Pool for FnPool<F, C>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<C, E>> + Send + 'static,
    C: Send + 'static,
    E: fmt::Display,
{
    fn get(&self) -> BoxFuture<'_, Result<Lent, String>> {
        let checkout = (self.get)();
        let client = self.client;
        Box::pin(async move {
            let checked_out = checkout.await.map_err(|e| e.to_string())?;
            Ok(Lent::Pooled(Box::new(Projected { checked_out, client })))
        })
    }
}
